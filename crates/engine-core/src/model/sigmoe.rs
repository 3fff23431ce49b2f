//! GLM-4.5's and MiniMax-M2's pieces beside the shared decoder: their multi-token-prediction
//! weights, which the model's forward does not read.

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::weights::WeightSource;

/// Logs the multi-token-prediction (MTP) tensors a checkpoint holds, which the model's
/// forward leaves unread: GLM-4.5's and DeepSeek-V3's `num_nextn_predict_layers` layers
/// stored after the last decoder layer (`model.layers.{num_hidden_layers}...`; the engine's
/// draft head reads the first, `mtp.rs`) and MiniMax-M2's `mtp` modules (not read at all).
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
            "the checkpoint's multi-token-prediction (MTP) layers are not part of the model: \
             DeepSeek-style ones (layers.N.eh_proj) draft for speculative decoding unless \
             option.speculative_mtp=false"
        );
    }
}
