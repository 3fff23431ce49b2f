//! Output constraints as each schema spells them, read into one neutral [`Constraint`]:
//! TGI's `parameters.grammar` and chat `response_format` (`{"type": "json" | "json_schema" |
//! "regex", "value": ..}`), OpenAI's `response_format` (`json_object`, `json_schema` with
//! `json_schema: {name, schema, strict}`), and vLLM's guided-decoding fields as LMI passes them
//! (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`).
//!
//! Only the shape is checked here; whether a schema or regex compiles is the server's call
//! (it needs the model's vocabulary), still before anything is queued.

use crate::error::ApiError;
use crate::fields::{Fields, Res, type_name};
use serde::Serialize;
use serde_json::Value;

/// The largest schema, regex or grammar accepted, in bytes of its JSON/text form.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// What the output must match.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Constraint {
    /// A JSON schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark syntax.
    Grammar(String),
}

impl Constraint {
    fn size(&self) -> usize {
        match self {
            Constraint::JsonSchema(v) => v.to_string().len(),
            Constraint::JsonObject => 0,
            Constraint::Regex(s) | Constraint::Grammar(s) => s.len(),
            Constraint::Choice(c) => c.iter().map(String::len).sum(),
        }
    }

    fn checked(self, param: &str) -> Res<Self> {
        if self.size() > MAX_GRAMMAR_BYTES {
            return Err(ApiError::validation(format!(
                "{param} is {} bytes; the limit is {MAX_GRAMMAR_BYTES}",
                self.size()
            ))
            .with_param(param));
        }
        Ok(self)
    }
}

fn err(param: &str, msg: impl std::fmt::Display) -> ApiError {
    ApiError::validation(format!("{param} {msg}")).with_param(param)
}

/// A schema given as a JSON object (or `true`), or as a string holding one (TGI and vLLM
/// accept both).
fn schema(v: &Value, param: &str) -> Res<Value> {
    let parsed = match v {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| err(param, format!("is not valid JSON: {e}")))?
        }
        other => other.clone(),
    };
    match parsed {
        Value::Object(_) | Value::Bool(true) => Ok(parsed),
        other => Err(err(
            param,
            format!("must be a JSON schema object, got {}", type_name(&other)),
        )),
    }
}

fn string(v: &Value, param: &str) -> Res<String> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => Err(err(param, "must not be empty")),
        other => Err(err(
            param,
            format!("must be a string, got {}", type_name(other)),
        )),
    }
}

/// TGI's `grammar` / `response_format` and OpenAI's `response_format`, at `param`. `text`
/// (OpenAI's default) is no constraint.
pub fn response_format(v: &Value, param: &str) -> Res<Option<Constraint>> {
    let Some(o) = v.as_object() else {
        return Err(err(
            param,
            format!("must be an object, got {}", type_name(v)),
        ));
    };
    let f = Fields::new(o, param);
    let kind = f
        .str("type")?
        .ok_or_else(|| err(param, "needs a \"type\""))?;
    let value = f.get("value");
    let value_param = format!("{param}.value");
    let c = match kind {
        "text" => return Ok(None),
        // TGI reads `json_object` as an alias of `json`, with the schema in `value`.
        "json_object" => match value {
            Some(v) => Constraint::JsonSchema(schema(v, &value_param)?),
            None => Constraint::JsonObject,
        },
        "json" => match value {
            Some(v) => Constraint::JsonSchema(schema(v, &value_param)?),
            None => return Err(err(param, "of type \"json\" needs a \"value\" schema")),
        },
        "json_schema" => {
            // OpenAI: {"json_schema": {"name", "schema", "strict"}}; TGI: {"value": {"name",
            // "schema"}}. Either may omit the wrapper and give the schema itself.
            let (key, wrapper) = match (f.get("json_schema"), value) {
                (Some(w), _) => ("json_schema", w),
                (None, Some(w)) => ("value", w),
                (None, None) => {
                    return Err(err(param, "of type \"json_schema\" needs \"json_schema\""));
                }
            };
            let wparam = format!("{param}.{key}");
            let inner = match wrapper.as_object() {
                Some(w) => {
                    let wf = Fields::new(w, &wparam);
                    wf.str("name")?;
                    wf.str("description")?;
                    wf.bool("strict")?;
                    match wf.get("schema") {
                        Some(s) => schema(s, &format!("{wparam}.schema"))?,
                        None if w.contains_key("name") || w.contains_key("strict") => {
                            // OpenAI allows a schema-less json_schema: any JSON object.
                            return Ok(Some(Constraint::JsonObject));
                        }
                        None => schema(wrapper, &wparam)?,
                    }
                }
                None => schema(wrapper, &wparam)?,
            };
            Constraint::JsonSchema(inner)
        }
        "regex" => match value {
            Some(v) => Constraint::Regex(string(v, &value_param)?),
            None => return Err(err(param, "of type \"regex\" needs a \"value\" pattern")),
        },
        other => {
            return Err(err(
                param,
                format!(
                    "type {other:?} is not one of \"text\", \"json_object\", \"json_schema\", \"json\", \"regex\""
                ),
            ));
        }
    };
    c.checked(param).map(Some)
}

/// vLLM's guided-decoding fields (as LMI passes them through), from the object `f`. At most
/// one may be set.
pub(crate) fn guided(f: &Fields) -> Res<Option<Constraint>> {
    const KEYS: [&str; 5] = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_json_object",
    ];
    let set: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| match f.get(k) {
            Some(Value::Bool(b)) => *b,
            Some(_) => true,
            None => false,
        })
        .collect();
    if set.len() > 1 {
        return Err(ApiError::validation(format!(
            "only one of {} may be set, got {}",
            KEYS.join(", "),
            set.join(" and ")
        ))
        .with_param(f.path(set[1])));
    }
    let Some(&key) = set.first() else {
        return Ok(None);
    };
    let param = f.path(key);
    let v = f.get(key).unwrap_or(&Value::Null);
    let c = match key {
        "guided_json" => Constraint::JsonSchema(schema(v, &param)?),
        "guided_regex" => Constraint::Regex(string(v, &param)?),
        "guided_grammar" => Constraint::Grammar(string(v, &param)?),
        "guided_json_object" => Constraint::JsonObject,
        _ => {
            let options = f
                .strings(key)?
                .ok_or_else(|| err(&param, "must be a list of strings"))?;
            if options.is_empty() {
                return Err(err(&param, "must not be empty"));
            }
            Constraint::Choice(options)
        }
    };
    c.checked(&param).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rf(v: Value) -> Res<Option<Constraint>> {
        response_format(&v, "response_format")
    }

    #[test]
    fn every_spelling_of_a_schema_reads_the_same() {
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let want = Some(Constraint::JsonSchema(s.clone()));
        assert_eq!(rf(json!({"type": "json", "value": s})).unwrap(), want);
        assert_eq!(
            rf(json!({"type": "json", "value": s.to_string()})).unwrap(),
            want
        );
        assert_eq!(
            rf(json!({"type": "json_object", "value": s})).unwrap(),
            want
        );
        assert_eq!(
            rf(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}))
                .unwrap(),
            want
        );
        assert_eq!(
            rf(json!({"type": "json_schema", "value": {"name": "x", "schema": s}})).unwrap(),
            want
        );
        assert_eq!(
            rf(json!({"type": "json_schema", "value": s})).unwrap(),
            want
        );
        assert_eq!(
            rf(json!({"type": "json_object"})).unwrap(),
            Some(Constraint::JsonObject)
        );
        assert_eq!(rf(json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            rf(json!({"type": "regex", "value": "[a-z]+"})).unwrap(),
            Some(Constraint::Regex("[a-z]+".into()))
        );
    }

    #[test]
    fn bad_formats_name_the_field() {
        for (body, param) in [
            (json!({"type": "yaml"}), "response_format"),
            (json!({"type": "json"}), "response_format"),
            (json!({"type": "json", "value": 3}), "response_format.value"),
            (
                json!({"type": "json", "value": "{not json"}),
                "response_format.value",
            ),
            (
                json!({"type": "regex", "value": ""}),
                "response_format.value",
            ),
            (json!({"type": "json_schema"}), "response_format"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}),
                "response_format.json_schema.schema",
            ),
            (json!("json"), "response_format"),
        ] {
            let e = rf(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
        let big = json!({"type": "regex", "value": "a".repeat(MAX_GRAMMAR_BYTES + 1)});
        assert!(rf(big).unwrap_err().message.contains("limit"));
    }

    #[test]
    fn guided_fields() {
        let read = |v: Value| {
            let o = v.as_object().unwrap().clone();
            guided(&Fields::new(&o, "parameters"))
        };
        assert_eq!(read(json!({})).unwrap(), None);
        assert_eq!(
            read(json!({"guided_choice": ["a", "b"]})).unwrap(),
            Some(Constraint::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            read(json!({"guided_json": "{\"type\": \"object\"}"})).unwrap(),
            Some(Constraint::JsonSchema(json!({"type": "object"})))
        );
        assert_eq!(
            read(json!({"guided_grammar": "start: \"x\""})).unwrap(),
            Some(Constraint::Grammar("start: \"x\"".into()))
        );
        assert_eq!(read(json!({"guided_json_object": false})).unwrap(), None);
        let e = read(json!({"guided_regex": "a", "guided_choice": ["b"]})).unwrap_err();
        assert!(e.message.contains("only one"), "{e}");
        let e = read(json!({"guided_choice": []})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("parameters.guided_choice"));
    }
}
