//! A checkpoint's `quantization_config`: the quantized formats that load (dequantized at load by
//! `weights/hf_quant.rs`), and one line for the others, so that a repository named on the Hub
//! in a format we cannot read is refused before its weights are fetched.

use serde_json::{Map, Value};

/// What loads, for the refusal's message.
const WHAT_LOADS: &str = "unquantized safetensors (f32, f16, bf16), FP8 with per-block scales (quant_method fp8), compressed-tensors int8/FP8 per channel or tensor and packed int4/int8 in groups (float-, int-, pack-quantized, symmetric), AutoAWQ's 4-bit GEMM layout, GPTQ (2, 4, 8 bits, v1 and v2, act-order), gpt-oss's MXFP4 experts, and GGUF files (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, MXFP4)";

/// A quantized HF format whose weights are dequantized at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HfQuant {
    /// `quant_method: fp8` (transformers' FineGrainedFP8, the `-FP8` repositories of Qwen,
    /// DeepSeek, MiniMax): E4M3 weights, `weight_scale_inv` per `[rows, cols]` block.
    Fp8Block { block: [usize; 2] },
    /// `quant_method: compressed-tensors` (llm-compressor's W8A8, FP8 and W4A16 repositories).
    Compressed(CompressedWeights),
    /// `quant_method: awq`, AutoAWQ's GEMM layout: 4-bit `qweight` [in, out/8] and `qzeros`
    /// [groups, out/8] packed in the order 0,2,4,6,1,3,5,7, `scales` [groups, out].
    AwqGemm { group: usize },
    /// `quant_method: gptq`: `qweight` [in·bits/32, out] packed along the input, `qzeros`
    /// [groups, out·bits/32] (stored minus one in the v1 `checkpoint_format: gptq`), `scales`
    /// [groups, out], `g_idx` [in] (each input's group; permuted under act-order).
    Gptq { bits: u32, v1: bool },
}

/// compressed-tensors' weight scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressedWeights {
    /// `pack-quantized`: `weight_packed` (int32, values densely packed along the input) and
    /// `weight_shape`; otherwise `weight` holds the values (int8 or FP8 E4M3).
    pub packed: bool,
    pub num_bits: u32,
    /// The scale grid: one scale per `[rows, cols]` cell of the weight (a channel is `[1,
    /// in]`, a group `[1, group_size]`, a whole tensor `[0, 0]`, meaning everything).
    pub grid: [usize; 2],
}

impl HfQuant {
    /// Reads `quantization_config`: None when there is none or it is gpt-oss's mxfp4 (read
    /// by its own code); an error naming the method when it does not load.
    pub fn from_config(config: &Map<String, Value>) -> Result<Option<Self>, String> {
        let Some(q) = config.get("quantization_config") else {
            return Ok(None);
        };
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("an unnamed method");
        let refuse = |detail: String| {
            Err(format!(
                "the checkpoint is quantized with {method}{detail}, which lmi does not load yet; it loads {WHAT_LOADS}: name the unquantized repository, or a GGUF one (org/name-GGUF:Q4_K_M)"
            ))
        };
        match method {
            "mxfp4" => Ok(None),
            "fp8" => match q.get("weight_block_size").and_then(pair) {
                Some(block) if block[0] > 0 && block[1] > 0 => {
                    Ok(Some(HfQuant::Fp8Block { block }))
                }
                _ => refuse(" (FP8 without weight_block_size)".into()),
            },
            "compressed-tensors" => compressed(q)
                .map(|c| Some(HfQuant::Compressed(c)))
                .or_else(refuse),
            "bitsandbytes" if q.get("load_in_4bit").and_then(Value::as_bool) == Some(true) => {
                refuse(" (4-bit)".into())
            }
            "awq" => {
                let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
                let bits = q
                    .get("bits")
                    .or_else(|| q.get("w_bit"))
                    .and_then(Value::as_u64)
                    .unwrap_or(4);
                let zero_point = q.get("zero_point").and_then(Value::as_bool).unwrap_or(true);
                let group = q
                    .get("group_size")
                    .or_else(|| q.get("q_group_size"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if version.eq_ignore_ascii_case("gemm") && bits == 4 && zero_point && group > 0 {
                    Ok(Some(HfQuant::AwqGemm {
                        group: group as usize,
                    }))
                } else {
                    refuse(format!(
                        " ({bits}-bit, version {version}{})",
                        if zero_point { "" } else { ", no zero point" }
                    ))
                }
            }
            "gptq" => {
                let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(0) as u32;
                let format = q
                    .get("checkpoint_format")
                    .and_then(Value::as_str)
                    .unwrap_or("gptq");
                let v1 = match format {
                    "gptq" => Some(true),
                    "gptq_v2" => Some(false),
                    _ => None,
                };
                match v1 {
                    Some(v1) if matches!(bits, 2 | 4 | 8) => Ok(Some(HfQuant::Gptq { bits, v1 })),
                    _ => refuse(format!(" ({bits}-bit, checkpoint_format {format})")),
                }
            }
            _ => refuse(String::new()),
        }
    }
}

fn pair(v: &Value) -> Option<[usize; 2]> {
    let a = v.as_array()?;
    match a.as_slice() {
        [r, c] => Some([r.as_u64()? as usize, c.as_u64()? as usize]),
        _ => None,
    }
}

/// The one weight scheme of a compressed-tensors config, or why it does not load.
fn compressed(q: &Value) -> Result<CompressedWeights, String> {
    let format = q.get("format").and_then(Value::as_str).unwrap_or("dense");
    let packed = match format {
        "pack-quantized" => true,
        "int-quantized" | "float-quantized" | "naive-quantized" => false,
        other => return Err(format!(" (format {other})")),
    };
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .ok_or(" (no config_groups)")?;
    let mut schemes = groups
        .values()
        .filter_map(|g| g.get("weights").filter(|w| !w.is_null()));
    let w = schemes.next().ok_or(" (no weight scheme)")?;
    if schemes.any(|other| other != w) {
        return Err(" (several weight schemes)".into());
    }
    let num_bits = w.get("num_bits").and_then(Value::as_u64).unwrap_or(8) as u32;
    let kind = w.get("type").and_then(Value::as_str).unwrap_or("int");
    let symmetric = w.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let strategy = w
        .get("strategy")
        .and_then(Value::as_str)
        .unwrap_or("tensor");
    let detail = format!(
        " ({format}, {kind}{num_bits} {strategy}{})",
        if symmetric { "" } else { ", asymmetric" }
    );
    let ok_bits = match (kind, packed) {
        ("float", false) => num_bits == 8,
        ("int", false) => num_bits == 8,
        ("int", true) => (2..=8).contains(&num_bits),
        _ => false,
    };
    if !ok_bits || !symmetric {
        return Err(detail);
    }
    let grid = match strategy {
        "tensor" => [0, 0],
        "channel" => [1, 0],
        "group" => match w.get("group_size").and_then(Value::as_u64) {
            Some(g) if g > 0 => [1, g as usize],
            _ => return Err(detail),
        },
        "block" => match w.get("block_structure").and_then(pair) {
            Some(b) if b[0] > 0 && b[1] > 0 => b,
            _ => return Err(detail),
        },
        _ => return Err(detail),
    };
    Ok(CompressedWeights {
        packed,
        num_bits,
        grid,
    })
}

/// Ok when the config declares no quantization or one that loads.
pub fn check(config: &Map<String, Value>) -> Result<(), String> {
    HfQuant::from_config(config).map(|_| ())
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

    fn parse(q: &str) -> Result<Option<HfQuant>, String> {
        let v: Value = serde_json::from_str(&format!(r#"{{"quantization_config": {q}}}"#)).unwrap();
        HfQuant::from_config(v.as_object().unwrap())
    }

    fn ct(format: &str, weights: &str) -> String {
        format!(
            r#"{{"quant_method": "compressed-tensors", "format": "{format}", "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {weights}, "input_activations": null}}}}}}"#
        )
    }

    #[test]
    fn the_formats_that_load_and_the_ones_refused() {
        assert_eq!(parse(r#"{"quant_method": "mxfp4"}"#), Ok(None));
        assert!(check_json(r#"{"architectures": ["Qwen3ForCausalLM"]}"#).is_ok());
        assert_eq!(
            parse(r#"{"quant_method": "fp8", "weight_block_size": [128, 128]}"#),
            Ok(Some(HfQuant::Fp8Block { block: [128, 128] }))
        );
        let int4 = ct(
            "pack-quantized",
            r#"{"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}"#,
        );
        assert_eq!(
            parse(&int4),
            Ok(Some(HfQuant::Compressed(CompressedWeights {
                packed: true,
                num_bits: 4,
                grid: [1, 128]
            })))
        );
        let fp8 = ct(
            "float-quantized",
            r#"{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel"}"#,
        );
        assert_eq!(
            parse(&fp8),
            Ok(Some(HfQuant::Compressed(CompressedWeights {
                packed: false,
                num_bits: 8,
                grid: [1, 0]
            })))
        );
        let e = parse(r#"{"quant_method": "fp8"}"#).unwrap_err();
        assert!(e.contains("without weight_block_size"), "{e}");
        assert_eq!(
            parse(
                r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}"#
            ),
            Ok(Some(HfQuant::AwqGemm { group: 128 }))
        );
        let e =
            parse(r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}"#)
                .unwrap_err();
        assert!(
            e.contains("awq (4-bit, version gemv)") && e.contains("GGUF"),
            "{e}"
        );
        assert_eq!(
            parse(r#"{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true}"#),
            Ok(Some(HfQuant::Gptq { bits: 4, v1: true }))
        );
        let e = parse(r#"{"quant_method": "gptq", "bits": 3}"#).unwrap_err();
        assert!(e.contains("gptq (3-bit, checkpoint_format gptq)"), "{e}");
        let asym = ct(
            "pack-quantized",
            r#"{"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group", "group_size": 128}"#,
        );
        let e = parse(&asym).unwrap_err();
        assert!(e.contains("asymmetric"), "{e}");
        let e = parse(&ct(
            "nvfp4-pack-quantized",
            r#"{"num_bits": 4, "type": "float"}"#,
        ))
        .unwrap_err();
        assert!(e.contains("nvfp4-pack-quantized"), "{e}");
    }
}
