//! Qwen3-Reranker's input, as its model card builds it: a system line asking for "yes" or
//! "no", the instruction, query and document in a user turn, and an assistant turn opened
//! with an empty think block; the score is read at the last token. Truncation cuts the
//! query-and-document body and keeps the frame (the card tokenizes the three parts apart and
//! truncates the body to what the frame leaves).

use crate::error::Result;
use crate::tokenizer::{Tokenizer, Truncate, TruncationSide};

pub const PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements \
     based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \
     \"no\".<|im_end|>\n<|im_start|>user\n";
pub const SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The instruction when a request gives none.
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// The user turn's body.
pub fn body(instruction: Option<&str>, query: &str, document: &str) -> String {
    let instruction = instruction.unwrap_or(DEFAULT_INSTRUCTION);
    format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}")
}

/// The whole prompt as text.
pub fn prompt(instruction: Option<&str>, query: &str, document: &str) -> String {
    format!("{PREFIX}{}{SUFFIX}", body(instruction, query, document))
}

/// The prompt's token ids: the frame's, and the body's cut to fit `truncate` where given
/// (the body's end, or its start with [`TruncationSide::Left`]). None when `truncate` leaves
/// no room for the frame.
pub fn encode(
    tok: &Tokenizer,
    instruction: Option<&str>,
    query: &str,
    document: &str,
    truncate: Option<Truncate>,
) -> Result<Option<Vec<u32>>> {
    let prefix = tok.encode(PREFIX, false)?;
    let suffix = tok.encode(SUFFIX, false)?;
    let mut body = tok.encode(&body(instruction, query, document), false)?;
    if let Some(t) = truncate {
        let Some(room) = t.max_tokens.checked_sub(prefix.len() + suffix.len()) else {
            return Ok(None);
        };
        if body.len() > room {
            match t.side {
                TruncationSide::Right => body.truncate(room),
                TruncationSide::Left => {
                    body.drain(..body.len() - room);
                }
            }
        }
    }
    Ok(Some([prefix, body, suffix].concat()))
}
