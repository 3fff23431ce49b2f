//! The LMI request body: `{inputs, parameters, stream, adapters}` (rolling batch when `inputs`
//! is a string, dynamic-batch schema when it is a list).

use crate::error::ApiError;
use crate::fields::{Fields, Res};
use crate::lmi::params::{ParamReport, parse_parameters};
use crate::spec::GenerationSpec;
use serde_json::Value;

/// Server-side LMI settings that change how requests are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LmiConfig {
    /// `option.tgi_compat`: `details` defaults to true.
    pub tgi_compat: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LmiInputs {
    /// Rolling-batch schema: one prompt, one result object.
    Single(String),
    /// Dynamic-batch schema: a list of prompts, a list of results in the same order.
    Batch(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct LmiRequest {
    pub inputs: LmiInputs,
    /// Spec shared by every input (its `adapter` is the one of the first input).
    pub spec: GenerationSpec,
    /// Adapter per input (None = base model), from `adapters` or `parameters.adapter_id`.
    pub adapters: Vec<Option<String>>,
    pub report: ParamReport,
}

impl LmiRequest {
    pub fn is_batch(&self) -> bool {
        matches!(self.inputs, LmiInputs::Batch(_))
    }

    pub fn prompts(&self) -> Vec<&str> {
        match &self.inputs {
            LmiInputs::Single(s) => vec![s.as_str()],
            LmiInputs::Batch(v) => v.iter().map(String::as_str).collect(),
        }
    }

    /// One (prompt, spec) per input, each spec carrying that input's adapter.
    pub fn items(&self) -> Vec<(String, GenerationSpec)> {
        self.prompts()
            .into_iter()
            .zip(&self.adapters)
            .map(|(p, a)| {
                (
                    p.to_string(),
                    GenerationSpec {
                        adapter: a.clone(),
                        ..self.spec.clone()
                    },
                )
            })
            .collect()
    }
}

/// Parse an LMI body (the caller has already seen that it has `inputs`).
pub fn parse_lmi_request(body: &Value, cfg: &LmiConfig) -> Res<LmiRequest> {
    let f = Fields::body(body)?;
    let inputs = match f.get("inputs") {
        None => return Err(ApiError::invalid_body("inputs is required").with_param("inputs")),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(ApiError::validation("inputs must not be empty").with_param("inputs"));
        }
        Some(Value::String(s)) => LmiInputs::Single(s.clone()),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(
                ApiError::validation("inputs must not be an empty list").with_param("inputs")
            );
        }
        Some(Value::Array(_)) => {
            let list = f.strings("inputs")?.unwrap_or_default();
            if let Some(i) = list.iter().position(String::is_empty) {
                return Err(
                    ApiError::validation(format!("inputs[{i}] must not be empty"))
                        .with_param("inputs"),
                );
            }
            LmiInputs::Batch(list)
        }
        Some(v) => return Err(f.type_err("inputs", "a string or an array of strings", v)),
    };
    let (mut spec, report) = parse_parameters(f.object("parameters")?, cfg.tgi_compat)?;
    spec.stream = f.bool("stream")?.unwrap_or(false);
    if spec.stream && spec.best_of > 1 {
        return Err(ApiError::validation(
            "parameters.n and parameters.best_of must be 1 when streaming",
        )
        .with_param("parameters.best_of"));
    }
    let count = match &inputs {
        LmiInputs::Single(_) => 1,
        LmiInputs::Batch(v) => v.len(),
    };
    let adapters = match f.strings("adapters")? {
        None => vec![spec.adapter.clone(); count],
        Some(list) if list.len() == 1 => vec![non_empty(&list[0]); count],
        Some(list) if list.len() == count => list.iter().map(|a| non_empty(a)).collect(),
        Some(list) => {
            return Err(ApiError::validation(format!(
                "adapters has {} entries but inputs has {count}; give one adapter or one per input",
                list.len()
            ))
            .with_param("adapters"));
        }
    };
    spec.adapter = adapters.first().cloned().flatten();
    Ok(LmiRequest {
        inputs,
        spec,
        adapters,
        report,
    })
}

/// LMI: `""` means the base model.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}
