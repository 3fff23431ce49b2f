//! OpenAI function tools: `tools`, `tool_choice` and `parallel_tool_calls` validated into
//! [`ToolSpec`], and the JSON schema that forces a call when `tool_choice` is `required` or
//! names a function (the output is then a call by construction, not parsed hopefully).

use crate::error::ApiError;
use crate::fields::{Fields, Res, type_name};
use serde_json::{Map, Value, json};

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    /// The tool as the client sent it, for the chat template.
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool: the tools are not shown to the model.
    None,
    /// The model decides; calls are parsed from its output.
    Auto,
    /// At least one call, enforced by a grammar.
    Required,
    /// Exactly this function, enforced by a grammar.
    Function(String),
}

/// The request's tools, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one turn (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolSpec {
    /// Tools the model is shown (none when `tool_choice` is `none`).
    pub fn offered(&self) -> &[Tool] {
        match self.choice {
            ToolChoice::None => &[],
            _ => &self.tools,
        }
    }

    /// True when the reply's text is to be read for tool calls.
    pub fn active(&self) -> bool {
        !self.offered().is_empty()
    }

    /// True when the call is forced by [`ToolSpec::forced_schema`].
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// The schema the output must match when a call is forced: one `{"name", "arguments"}`
    /// object for a named function, an array of them (one or more; exactly one without
    /// `parallel_tool_calls`) for `required`.
    pub fn forced_schema(&self) -> Option<Value> {
        let call = |t: &Tool| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        };
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Function(name) => self.tools.iter().find(|t| &t.name == name).map(call),
            ToolChoice::Required => {
                let calls: Vec<Value> = self.tools.iter().map(call).collect();
                let item = if calls.len() == 1 {
                    calls.into_iter().next().unwrap_or(Value::Bool(true))
                } else {
                    json!({"anyOf": calls})
                };
                let mut s = json!({"type": "array", "items": item, "minItems": 1});
                if !self.parallel {
                    s["maxItems"] = json!(1);
                }
                Some(s)
            }
        }
    }
}

fn verr(param: &str, msg: impl std::fmt::Display) -> ApiError {
    ApiError::validation(format!("{param} {msg}")).with_param(param)
}

/// OpenAI's rule for function names.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tool(v: &Value, i: usize) -> Res<Tool> {
    let param = format!("tools[{i}]");
    let o = v
        .as_object()
        .ok_or_else(|| verr(&param, format!("must be an object, got {}", type_name(v))))?;
    let f = Fields::new(o, &param);
    match f.str("type")? {
        Some("function") | None => {}
        Some(other) => {
            return Err(verr(
                &format!("{param}.type"),
                format!("must be \"function\", got {other:?}"),
            ));
        }
    }
    let fparam = format!("{param}.function");
    let func = f
        .object("function")?
        .ok_or_else(|| verr(&param, "needs a \"function\" object"))?;
    let ff = Fields::new(func, &fparam);
    let name = ff
        .str("name")?
        .ok_or_else(|| verr(&fparam, "needs a \"name\""))?;
    if !valid_name(name) {
        return Err(verr(
            &format!("{fparam}.name"),
            format!("must be 1 to 64 letters, digits, '_' or '-', got {name:?}"),
        ));
    }
    ff.str("description")?;
    ff.bool("strict")?;
    let parameters = match ff.get("parameters") {
        None => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(p) => {
            return Err(verr(
                &format!("{fparam}.parameters"),
                format!("must be a JSON schema object, got {}", type_name(p)),
            ));
        }
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
        raw: v.clone(),
    })
}

/// `tools`, `tool_choice` and `parallel_tool_calls` from a chat body. None when no tools are
/// given and `tool_choice` is absent or `none`.
pub(crate) fn read_tools(f: &Fields) -> Res<Option<ToolSpec>> {
    let tools = match f.get("tools") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| tool(t, i))
            .collect::<Res<Vec<_>>>()?,
        Some(v) => return Err(f.type_err("tools", "an array", v)),
        None => Vec::new(),
    };
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(verr(
                &format!("tools[{i}].function.name"),
                format!("repeats the name {:?}", t.name),
            ));
        }
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(verr(
                    "tool_choice",
                    format!(
                        "must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}, got {other:?}"
                    ),
                ));
            }
        },
        Some(Value::Object(o)) => named_choice(o)?,
        Some(v) => return Err(f.type_err("tool_choice", "a string or an object", v)),
    };
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    if tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(verr(
                "tool_choice",
                "requires `tools`: name the functions the model may call",
            )),
        };
    }
    if let ToolChoice::Function(name) = &choice
        && !tools.iter().any(|t| &t.name == name)
    {
        let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        return Err(verr(
            "tool_choice.function.name",
            format!("{name:?} is not one of the tools ({})", known.join(", ")),
        ));
    }
    Ok(Some(ToolSpec {
        tools,
        choice,
        parallel,
    }))
}

fn named_choice(o: &Map<String, Value>) -> Res<ToolChoice> {
    let f = Fields::new(o, "tool_choice");
    match f.str("type")? {
        Some("function") | None => {}
        Some(other) => {
            return Err(verr(
                "tool_choice.type",
                format!("must be \"function\", got {other:?}"),
            ));
        }
    }
    let func = f
        .object("function")?
        .ok_or_else(|| verr("tool_choice", "needs a \"function\" object with a \"name\""))?;
    let name = Fields::new(func, "tool_choice.function")
        .str("name")?
        .ok_or_else(|| verr("tool_choice.function", "needs a \"name\""))?;
    Ok(ToolChoice::Function(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(v: Value) -> Res<Option<ToolSpec>> {
        let o = v.as_object().unwrap().clone();
        read_tools(&Fields::new(&o, ""))
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}})
    }

    #[test]
    fn choices_and_forced_schemas() {
        assert_eq!(read(json!({})).unwrap(), None);
        assert_eq!(read(json!({"tool_choice": "none"})).unwrap(), None);
        let t = read(json!({"tools": [weather()]})).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.active() && !t.forced() && t.forced_schema().is_none());
        let t = read(json!({"tools": [weather()], "tool_choice": "none"}))
            .unwrap()
            .unwrap();
        assert!(!t.active());
        let t = read(
            json!({"tools": [weather(), {"type": "function", "function": {"name": "now"}}],
            "tool_choice": "required", "parallel_tool_calls": false}),
        )
        .unwrap()
        .unwrap();
        let s = t.forced_schema().unwrap();
        assert_eq!(s["type"], "array");
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["items"]["anyOf"][1]["properties"]["name"]["const"], "now");
        assert_eq!(
            s["items"]["anyOf"][1]["properties"]["arguments"]["type"],
            "object"
        );
        let t = read(json!({"tools": [weather()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
        .unwrap()
        .unwrap();
        let s = t.forced_schema().unwrap();
        assert_eq!(s["properties"]["name"]["const"], "get_weather");
        assert_eq!(s["properties"]["arguments"]["required"][0], "city");
    }

    #[test]
    fn bad_tools_say_what_to_fix() {
        for (body, param) in [
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (json!({"tools": [{"type": "function"}]}), "tools[0]"),
            (
                json!({"tools": [{"function": {"name": "x", "parameters": "s"}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [weather(), weather()]}),
                "tools[1].function.name",
            ),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice.function.name",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function"}}),
                "tool_choice",
            ),
            (json!({"tools": {}}), "tools"),
        ] {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
    }
}
