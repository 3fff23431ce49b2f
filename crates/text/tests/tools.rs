// Only SMOLLM2 is used here.
#[allow(dead_code)]
#[path = "common/templates.rs"]
mod templates;

use lmi_text::{
    ChatTemplate, JinjaChatTemplate, JsonChatTemplate, Message, ParsedToolCall, RoleFormat,
    ToolCallFormat, parse_tool_calls, prepare_messages,
};
use serde_json::{Value, json};
use templates::SMOLLM2;

/// A Qwen-2.5-like template with tool support, reading every tool field.
const QWEN_TOOLS_LIKE: &str = r##"
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nCall a tool as <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls is defined %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + call.function.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response id="' + message.tool_call_id + '" name="' + message.name + '">\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- elif message.role != 'system' %}
        {{- '<|im_start|>' + message.role + '\n' + message.content }}
        {%- if message.tool_call_id is defined or message.name is defined %}{{- ' [unexpected tool field]' }}{%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"##;

fn jinja(src: &str) -> ChatTemplate {
    ChatTemplate::Jinja(JinjaChatTemplate::new(src, None, None).unwrap())
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Get the city's weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}})
}

/// An OpenAI conversation with one tool round trip, parsed as the server parses it.
fn conversation() -> Vec<Message> {
    serde_json::from_value(json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C"}
    ]))
    .unwrap()
}

// Expected text rendered by Python's jinja2 set up as transformers' apply_chat_template
// (trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)), with the tool call
// arguments decoded as vLLM does. The tool's keys stay in the order written, as in a Python
// dict.
#[test]
fn template_with_tools_renders_like_transformers() {
    let t = jinja(QWEN_TOOLS_LIKE);
    assert!(t.supports_tools());
    let out = t
        .render_with_tools(&conversation(), Some(&[weather_tool()]), true, false)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the city's weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nCall a tool as <tool_call>\n{\"name\": <name>, \"arguments\": <object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response id=\"call_1\" name=\"get_weather\">\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(ToolCallFormat::detect(Some(&t)), ToolCallFormat::Hermes);
}

#[test]
fn without_tools_the_template_sees_none_and_no_tool_fields() {
    let t = jinja(QWEN_TOOLS_LIKE);
    let m = [Message::new("user", "Hi")];
    assert_eq!(
        t.render(&m, false, false).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n"
    );
    let probe = jinja("{{ tools is none }}|{{ tools | length if tools is not none else '-' }}");
    assert_eq!(probe.render(&m, false, false).unwrap(), "True|-");
    assert_eq!(
        probe
            .render_with_tools(&m, Some(&[]), false, false)
            .unwrap(),
        "False|0"
    );
}

#[test]
fn arguments_that_are_not_a_json_object_stay_a_string() {
    let t = jinja(
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments is string }};{% endfor %}{% endfor %}",
    );
    let m: Vec<Message> = serde_json::from_value(json!([{"role": "assistant", "tool_calls": [
        {"function": {"name": "a", "arguments": "{\"x\": 1}"}},
        {"function": {"name": "b", "arguments": "not json"}},
        {"function": {"name": "c", "arguments": "[1]"}}]}]))
    .unwrap();
    assert_eq!(t.render(&m, false, false).unwrap(), "False;True;True;");
}

#[test]
fn smollm2_template_renders_a_prepared_tool_conversation() {
    let t = jinja(SMOLLM2);
    assert!(!t.supports_tools());
    let format = ToolCallFormat::detect(Some(&t));
    assert_eq!(format, ToolCallFormat::SmolLm);
    let m = prepare_messages(
        format,
        &conversation(),
        &[weather_tool()],
        t.supports_tools(),
    );
    let out = t
        .render_with_tools(&m, Some(&[weather_tool()]), true, false)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.\n\n\
         You can call these functions, described in JSON:\n<tools>\n\
         {\"name\":\"get_weather\",\"description\":\"Get the city's weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}\n\
         </tools>\n\n\
         To call functions, reply with only a list of calls inside <tool_call></tool_call>, for example:\n\
         <tool_call>[{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}]</tool_call>\n\
         If no function fits the request, answer in plain text.<|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}]</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn rewritten_history_parses_back_in_every_format() {
    for format in ToolCallFormat::ALL {
        let m = prepare_messages(format, &conversation(), &[], false);
        assert_eq!(m.len(), 4, "{format}");
        let (content, calls) = parse_tool_calls(format, &m[2].content.text());
        assert_eq!(content, "", "{format}");
        assert_eq!(
            calls,
            [ParsedToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }],
            "{format}"
        );
    }
}

#[test]
fn json_template_renders_a_prepared_tool_conversation() {
    let role = |p: &str| RoleFormat {
        prefix: format!("<{p}>"),
        suffix: format!("</{p}>"),
    };
    let t = ChatTemplate::Json(JsonChatTemplate {
        roles: [
            ("system".to_owned(), role("s")),
            ("user".to_owned(), role("u")),
            ("assistant".to_owned(), role("a")),
        ]
        .into(),
        ..Default::default()
    });
    assert!(!t.supports_tools());
    let m = prepare_messages(ToolCallFormat::Hermes, &conversation()[1..], &[], false);
    assert_eq!(
        t.render_with_tools(&m, None, false, false).unwrap(),
        "<u>Weather in Paris?</u>\
         <a><tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call></a>\
         <u><tool_response>\n18C\n</tool_response></u>"
    );
}
