//! GLM-4.5's and MiniMax-M2's pieces beside the shared decoder: their multi-token-prediction
//! weights, which are not read.

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::weights::WeightSource;

/// Logs the multi-token-prediction (MTP) tensors a checkpoint holds and lmi leaves unread:
/// GLM-4.5's `num_nextn_predict_layers` layers stored after the last decoder layer
/// (`model.layers.{num_hidden_layers}...`) and MiniMax-M2's `mtp` modules. lmi's speculation
/// takes a separate draft model; these layers would need the target's hidden states.
pub(super) fn note_skipped_mtp(c: &ModelConfig, st: &WeightSource, lm: &str) {
    let WeightSource::Safetensors(s) = st else {
        return;
    };
    let after = format!("{lm}layers.{}.", c.num_layers);
    let n = s
        .names()
        .filter(|n| n.starts_with(&after) || n.contains(".mtp") || n.starts_with("mtp"))
        .count();
    if n > 0 {
        tracing::info!(
            tensors = n,
            "skipping the checkpoint's multi-token-prediction (MTP) layers: lmi does not use \
             them as a speculative draft"
        );
    }
}
