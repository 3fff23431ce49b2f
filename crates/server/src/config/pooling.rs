//! Options of embedding and scoring models: what the model is served for (LMI's
//! `option.task`, also `HF_TASK` and `--task`) and how many inputs one embedding or rerank
//! request may carry (TEI's `max_client_batch_size`).

use std::collections::BTreeMap;

use anyhow::bail;
use lmi_checkpoint::pooling::Task;

use super::Setting;

/// Inputs per embedding or rerank request when option.max_client_batch_size is unset. The
/// generation routes keep TGI's 4 for the same key (list prompts); an embedding request
/// commonly carries a whole batch of documents (OpenAI accepts 2048).
pub const DEFAULT_MAX_POOLING_INPUTS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingOptions {
    /// option.task: None, as the model's files say (sentence-transformers modules, a
    /// sequence-classification architecture), else generation.
    pub task: Option<Task>,
    /// Most inputs (texts, or documents to rank) in one request: option.max_client_batch_size,
    /// else [`DEFAULT_MAX_POOLING_INPUTS`]; more are a 413 naming the limit.
    pub max_inputs: usize,
}

pub(super) fn parse(raw: &BTreeMap<String, Setting>) -> anyhow::Result<PoolingOptions> {
    let task = match raw
        .get("option.task")
        .filter(|s| !s.value.trim().is_empty())
    {
        None => None,
        Some(s) => Some(Task::from_option(&s.value).ok_or_else(|| {
            anyhow::anyhow!(
                "option.task={:?} ({}): expected text-generation, text-embedding or rerank",
                s.value,
                s.source
            )
        })?),
    };
    let key = "option.max_client_batch_size";
    let max_inputs = match raw.get(key) {
        None => DEFAULT_MAX_POOLING_INPUTS,
        Some(s) => match s.value.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => bail!(
                "{key}={:?} ({}): expected a positive integer",
                s.value,
                s.source
            ),
        },
    };
    Ok(PoolingOptions { task, max_inputs })
}

/// The most a pooling model's step budget grows to by default ([`step_tokens`]).
pub const MAX_DEFAULT_STEP_TOKENS: usize = 8192;

/// Tokens per step for an embedding or scoring model whose inputs run up to
/// `max_input_tokens`. Each input runs whole in one step, so where
/// option.max_rolling_batch_prefill_tokens is not set the default budget (256 on the CPU)
/// grows to hold the longest input, up to [`MAX_DEFAULT_STEP_TOKENS`]; a set value stands,
/// and inputs beyond it are refused or truncated.
pub fn step_tokens(config: &super::ServingConfig, max_input_tokens: usize) -> usize {
    let set = [
        "option.max_rolling_batch_prefill_tokens",
        "option.max_num_batched_tokens",
    ]
    .iter()
    .any(|k| config.raw.contains_key(*k));
    let budget = config.max_rolling_batch_prefill_tokens;
    match set {
        true => budget,
        false => budget.max(max_input_tokens.min(MAX_DEFAULT_STEP_TOKENS)),
    }
}
