//! A checkpoint's `quantization_config`: the quantized formats that load, and one line for
//! the others, so that a quantized repository named on the Hub is refused before its weights
//! are fetched rather than failing on its first unknown tensor type.

use serde_json::{Map, Value};

/// What loads, for the refusal's message.
const WHAT_LOADS: &str = "unquantized safetensors (f32, f16, bf16), gpt-oss's MXFP4 experts, and GGUF files (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, MXFP4)";

/// Ok when the config declares no quantization or one that loads (gpt-oss's `mxfp4`).
pub fn check(config: &Map<String, Value>) -> Result<(), String> {
    let Some(q) = config.get("quantization_config") else {
        return Ok(());
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("an unnamed method");
    if method == "mxfp4" {
        return Ok(());
    }
    let detail = match method {
        "fp8" => q
            .get("weight_block_size")
            .map(|b| format!(" (block-wise FP8, blocks {b})"))
            .unwrap_or_else(|| " (FP8)".into()),
        "compressed-tensors" => q
            .get("format")
            .and_then(Value::as_str)
            .map(|f| format!(" ({f})"))
            .unwrap_or_default(),
        "bitsandbytes" if q.get("load_in_4bit").and_then(Value::as_bool) == Some(true) => {
            " (4-bit)".into()
        }
        "gptq" | "awq" => q
            .get("bits")
            .and_then(Value::as_u64)
            .map(|b| format!(" ({b}-bit)"))
            .unwrap_or_default(),
        _ => String::new(),
    };
    Err(format!(
        "the checkpoint is quantized with {method}{detail}, which lmi does not load yet; it loads {WHAT_LOADS}: name the unquantized repository, or a GGUF one (org/name-GGUF:Q4_K_M)"
    ))
}

/// [`check`] on config.json's text (the Hub fetch reads it before the weights).
pub fn check_json(text: &str) -> Result<(), String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => check(&m),
        _ => Ok(()), // not ours to judge here: the config parser says what is wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_checkpoints_are_named_and_refused() {
        assert!(check_json(r#"{"architectures": ["Qwen3ForCausalLM"]}"#).is_ok());
        assert!(check_json(r#"{"quantization_config": {"quant_method": "mxfp4"}}"#).is_ok());
        let e = check_json(
            r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#,
        )
        .unwrap_err();
        assert!(
            e.contains("fp8 (block-wise FP8, blocks [128,128])") && e.contains("GGUF"),
            "{e}"
        );
        let e = check_json(r#"{"quantization_config": {"quant_method": "awq", "bits": 4}}"#)
            .unwrap_err();
        assert!(e.contains("awq (4-bit)"), "{e}");
        let e = check_json(r#"{"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"}}"#)
            .unwrap_err();
        assert!(e.contains("compressed-tensors (pack-quantized)"), "{e}");
    }
}
