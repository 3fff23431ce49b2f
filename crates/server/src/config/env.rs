//! Environment variables → configuration keys, as LMI maps them (lmi.md §1.3):
//! `OPTION_<KEY>` → `option.<key>`, `SERVING_<KEY>` → a global key, `HF_MODEL_ID` →
//! `option.model_id`, and the TGI/SageMaker aliases, which count only when the LMI variable
//! they stand for is unset.

use std::collections::BTreeMap;

/// The process environment, or a literal one in tests.
pub type EnvVars = BTreeMap<String, String>;

/// Global (non-`option.`) keys that `SERVING_<KEY>` and serving.properties may set.
pub const GLOBAL_KEYS: &[&str] = &[
    "engine",
    "batch_size",
    "max_dynamic_batch_size",
    "max_batch_delay",
    "job_queue_size",
    "max_request_size",
    "max_idle_time",
];

/// TGI/SageMaker alias → the LMI variable it stands for. `ENABLE_CUDA_GRAPHS` is inverted into
/// `OPTION_ENFORCE_EAGER`.
const ALIASES: &[(&str, &str)] = &[
    ("SM_NUM_GPUS", "TENSOR_PARALLEL_DEGREE"),
    ("MAX_BATCH_SIZE", "OPTION_MAX_ROLLING_BATCH_SIZE"),
    ("MAX_CONCURRENT_REQUESTS", "SERVING_JOB_QUEUE_SIZE"),
    (
        "MAX_BATCH_PREFILL_TOKENS",
        "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS",
    ),
    ("HF_MODEL_QUANTIZE", "OPTION_QUANTIZE"),
    ("CUDA_MEMORY_FRACTION", "OPTION_GPU_MEMORY_UTILIZATION"),
    ("ENABLE_CUDA_GRAPHS", "OPTION_ENFORCE_EAGER"),
    // TGI's and TEI's name.
    ("MAX_CLIENT_BATCH_SIZE", "OPTION_MAX_CLIENT_BATCH_SIZE"),
];

/// One key set from the environment, with the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSetting {
    pub key: String,
    pub value: String,
    pub var: String,
}

/// The configuration keys the environment sets, lowest precedence first (a later entry for
/// the same key wins).
pub fn settings(env: &EnvVars) -> Vec<EnvSetting> {
    // Expand aliases into the LMI variables they stand for, only where those are unset.
    let mut vars: BTreeMap<String, (String, String)> = env
        .iter()
        .map(|(k, v)| (k.clone(), (v.clone(), k.clone())))
        .collect();
    for (alias, target) in ALIASES {
        if let Some(v) = env.get(*alias)
            && !env.contains_key(*target)
        {
            let value = if *alias == "ENABLE_CUDA_GRAPHS" {
                (!v.trim().eq_ignore_ascii_case("true")).to_string()
            } else {
                v.clone()
            };
            vars.insert(
                target.to_string(),
                (value, format!("{alias} (alias of {target})")),
            );
        }
    }
    let mut out = Vec::new();
    let mut push = |key: &str, (value, var): &(String, String)| {
        out.push(EnvSetting {
            key: key.to_string(),
            value: value.clone(),
            var: var.clone(),
        })
    };
    // HF_* first so that OPTION_MODEL_ID etc. win over them.
    for (var, key) in [
        ("HF_MODEL_ID", "option.model_id"),
        ("HF_REVISION", "option.revision"),
        ("HF_TASK", "option.task"),
        ("HF_MODEL_TRUST_REMOTE_CODE", "option.trust_remote_code"),
        ("TENSOR_PARALLEL_DEGREE", "option.tensor_parallel_degree"),
        (
            "PIPELINE_PARALLEL_DEGREE",
            "option.pipeline_parallel_degree",
        ),
    ] {
        if let Some(v) = vars.get(var) {
            push(key, v);
        }
    }
    // SageMaker's request size: MiB first, so that the exact byte count wins.
    if let Some((mb, var)) = vars.get("SAGEMAKER_MAX_PAYLOAD_IN_MB") {
        let bytes = mb
            .trim()
            .parse::<f64>()
            .map(|m| ((m * 1024.0 * 1024.0) as u64).to_string())
            .unwrap_or_else(|_| mb.clone());
        push("max_request_size", &(bytes, var.clone()));
    }
    if let Some(v) = vars.get("SAGEMAKER_MAX_REQUEST_SIZE") {
        push("max_request_size", v);
    }
    for (var, v) in &vars {
        if let Some(rest) = var.strip_prefix("SERVING_") {
            let key = rest.to_ascii_lowercase();
            if GLOBAL_KEYS.contains(&key.as_str()) {
                push(&key, v);
            }
        }
    }
    for (var, v) in &vars {
        if let Some(rest) = var.strip_prefix("OPTION_") {
            if rest.is_empty() {
                continue;
            }
            let key = match rest {
                "ENGINE" => "engine".to_string(),
                "ENTRYPOINT" => "option.entryPoint".to_string(),
                _ => format!("option.{}", rest.to_ascii_lowercase()),
            };
            push(&key, v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> EnvVars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn value(s: &[EnvSetting], key: &str) -> Option<String> {
        s.iter()
            .rev()
            .find(|e| e.key == key)
            .map(|e| e.value.clone())
    }

    #[test]
    fn option_vars_become_option_keys() {
        let s = settings(&env(&[
            ("OPTION_MAX_ROLLING_BATCH_SIZE", "8"),
            ("OPTION_ENTRYPOINT", "djl_python.huggingface"),
            ("OPTION_ENGINE", "Python"),
            ("SERVING_JOB_QUEUE_SIZE", "5"),
            ("SERVING_UNKNOWN_THING", "x"),
            ("PATH", "/bin"),
        ]));
        assert_eq!(
            value(&s, "option.max_rolling_batch_size").as_deref(),
            Some("8")
        );
        assert_eq!(
            value(&s, "option.entryPoint").as_deref(),
            Some("djl_python.huggingface")
        );
        assert_eq!(value(&s, "engine").as_deref(), Some("Python"));
        assert_eq!(value(&s, "job_queue_size").as_deref(), Some("5"));
        assert_eq!(value(&s, "unknown_thing"), None);
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn aliases_apply_only_when_the_lmi_variable_is_unset() {
        let s = settings(&env(&[
            ("MAX_BATCH_SIZE", "16"),
            ("MAX_CONCURRENT_REQUESTS", "7"),
            ("SERVING_JOB_QUEUE_SIZE", "9"),
            ("SM_NUM_GPUS", "2"),
            ("ENABLE_CUDA_GRAPHS", "true"),
        ]));
        assert_eq!(
            value(&s, "option.max_rolling_batch_size").as_deref(),
            Some("16")
        );
        assert_eq!(value(&s, "job_queue_size").as_deref(), Some("9"));
        assert_eq!(
            value(&s, "option.tensor_parallel_degree").as_deref(),
            Some("2")
        );
        assert_eq!(value(&s, "option.enforce_eager").as_deref(), Some("false"));
    }

    #[test]
    fn option_model_id_beats_hf_model_id_and_payload_mb_is_converted() {
        let s = settings(&env(&[
            ("HF_MODEL_ID", "/models/a"),
            ("OPTION_MODEL_ID", "/models/b"),
            ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6"),
        ]));
        assert_eq!(value(&s, "option.model_id").as_deref(), Some("/models/b"));
        assert_eq!(value(&s, "max_request_size").as_deref(), Some("6291456"));
    }
}
