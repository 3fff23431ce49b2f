//! What an embedding or scoring model returns, read from its directory as sentence-transformers
//! writes it (`modules.json`, `1_Pooling/config.json`, `2_Dense/`, `Normalize`,
//! `config_sentence_transformers.json`, `sentence_bert_config.json`) and from `config.json`
//! (a `*ForSequenceClassification` architecture and its `id2label`), or set by
//! `option.task`. A generative model has none.

use std::path::PathBuf;

mod read;
#[cfg(test)]
mod tests;

pub use read::yes_no_ids;

/// What a model is served for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Text generation (chat, completions): every model that is not one of the below.
    Generate,
    /// Sentence embeddings (`/v1/embeddings`, TEI's `/embed`).
    Embed,
    /// A score per input or per (query, document) pair: cross-encoders and other sequence
    /// classifiers (`/rerank`, `/v1/rerank`, `/score`, TEI's `/predict`), and Qwen3-Reranker.
    Score,
}

impl Task {
    /// LMI's `option.task` values (and vLLM's `--task` names) for this task.
    pub fn from_option(s: &str) -> Option<Task> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "text-generation" | "generate" | "chat" => Some(Task::Generate),
            "text-embedding" | "embedding" | "embed" | "feature-extraction" => Some(Task::Embed),
            "rerank" | "reranking" | "score" | "text-classification" | "classify" => {
                Some(Task::Score)
            }
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Task::Generate => "text-generation",
            Task::Embed => "text-embedding",
            Task::Score => "rerank",
        }
    }
}

/// How a sequence's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's ([CLS]).
    Cls,
    /// The mean over the sequence's tokens.
    Mean,
    /// The last token's (decoder embedders: Qwen3-Embedding).
    Last,
}

/// One sentence-transformers `Dense` module after pooling (`2_Dense/`, EmbeddingGemma's two).
#[derive(Debug, Clone, PartialEq)]
pub struct DenseSpec {
    /// Its directory (`config.json` and `model.safetensors` with `linear.weight`, `linear.bias`).
    pub dir: PathBuf,
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    /// `torch.nn.modules.linear.Identity` (none) or `torch.nn.modules.activation.Tanh`.
    pub tanh: bool,
}

/// The head that turns the pooled state into scores ([`Task::Score`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ScoreHead {
    /// `BertForSequenceClassification`: BERT's pooler (dense + tanh on [CLS]) then
    /// `classifier` (`num_labels` outputs).
    BertClassifier,
    /// `XLMRobertaForSequenceClassification` (and RoBERTa's): `classifier.dense` + tanh on
    /// [CLS], then `classifier.out_proj`.
    RobertaClassifier,
    /// Qwen3-Reranker from its causal-LM checkpoint: `logit(yes) − logit(no)` at the last
    /// token (the LM head's two rows, subtracted), as vLLM and TEI compute it.
    YesNo { yes: u32, no: u32 },
}

/// How a (query, document) pair is made into one input for [`Task::Score`].
#[derive(Debug, Clone, PartialEq)]
pub enum PairInput {
    /// The tokenizer's pair encoding (`[CLS] q [SEP] d [SEP]`, BERT's token types 0 then 1).
    Tokenizer,
    /// Qwen3-Reranker's prompt: its system line, `<Instruct>: {instruction}\n<Query>: {q}\n
    /// <Document>: {d}`, in its chat frame ending with an empty think block.
    Qwen3Reranker,
}

/// What an embedding or scoring model computes, and what its routes need to know.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolerInfo {
    pub task: Task,
    pub pooling: Pooling,
    /// Dense modules after pooling, in order.
    pub dense: Vec<DenseSpec>,
    /// sentence-transformers' `Normalize` module is in the pipeline: routes normalize by
    /// default (TEI's `normalize` and the OpenAI route follow it).
    pub normalize: bool,
    /// Width of an output vector: the embedding's dimensions, or the number of scores.
    pub dimensions: usize,
    /// The model was trained so that a vector's leading dimensions are an embedding
    /// themselves (Matryoshka: OpenAI's `dimensions` truncates and renormalizes). Set by
    /// `config_sentence_transformers.json`'s `truncate_dim`/`matryoshka_dims` or known
    /// families (Qwen3-Embedding).
    pub matryoshka: bool,
    /// `config_sentence_transformers.json`'s `prompts` (name → text prepended to an input)
    /// and `default_prompt_name`.
    pub prompts: Vec<(String, String)>,
    pub default_prompt_name: Option<String>,
    /// The longest input in tokens (`sentence_bert_config.json`'s `max_seq_length`, else the
    /// position table's length).
    pub max_input_tokens: usize,
    /// Scoring models: the head, and each output's label (`id2label`, in order).
    pub score_head: Option<ScoreHead>,
    pub labels: Vec<String>,
    pub pair_input: PairInput,
}

impl PoolerInfo {
    /// The prompt text for `name`, or the default prompt when `name` is None.
    pub fn prompt(&self, name: Option<&str>) -> Option<&str> {
        let name = name.or(self.default_prompt_name.as_deref())?;
        self.prompts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_str())
    }
}
