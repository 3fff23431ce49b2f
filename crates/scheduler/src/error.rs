/// Why a request was refused at submit, before it was queued.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty: send at least one token")]
    EmptyPrompt,
    #[error(
        "prompt ({prompt} tokens) + max_new_tokens ({max_new}) = {total} exceeds the model's maximum length of {max_len} tokens: shorten the input or lower max_new_tokens"
    )]
    TooLong {
        prompt: usize,
        max_new: usize,
        total: usize,
        max_len: usize,
    },
    #[error(
        "the request needs {needed} KV blocks ({tokens} tokens) but the cache has {available} usable blocks: shorten the input or lower max_new_tokens"
    )]
    NeverFits {
        needed: usize,
        tokens: usize,
        available: usize,
    },
    /// A pooling input that can never run: it exceeds `limit` (which names the option or
    /// model property that sets it).
    #[error("the input has {tokens} tokens, more than {limit}: truncate it or send a shorter one")]
    InputTooLong { tokens: usize, limit: String },
    #[error("invalid parameter: {0}")]
    InvalidParams(String),
    #[error("the queue is full ({0} requests waiting): retry later")]
    QueueFull(usize),
    #[error("the scheduler has stopped")]
    Stopped,
}
