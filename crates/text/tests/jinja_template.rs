#[path = "common/templates.rs"]
mod templates;

use lmi_text::{JinjaChatTemplate, Message, TextError};
use templates::{LLAMA3_LIKE, QWEN2_VL_LIKE, QWEN3_LIKE, QWEN25, SMOLLM2};

fn jinja(src: &str) -> JinjaChatTemplate {
    JinjaChatTemplate::new(src, Some("<s>"), Some("</s>")).unwrap()
}

fn render(src: &str, m: &[Message], add_gen: bool) -> String {
    jinja(src).render(m, add_gen, false).unwrap()
}

#[test]
fn smollm2_injects_its_system_prompt() {
    let m = [Message::new("user", "What is 2+2?")];
    assert_eq!(
        render(SMOLLM2, &m, true),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_with_system_and_multi_turn() {
    let m = [
        Message::new("system", "Be terse."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello."),
        Message::new("user", "Bye"),
    ];
    assert_eq!(
        render(SMOLLM2, &m, false),
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
}

#[test]
fn qwen25_default_and_explicit_system() {
    let m = [Message::new("user", "Hi")];
    assert_eq!(
        render(QWEN25, &m, true),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let m = [Message::new("system", "S"), Message::new("user", "Hi")];
    assert_eq!(
        render(QWEN25, &m, false),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn enable_thinking_reaches_the_template() {
    let m = [Message::new("user", "Q")];
    let t = jinja(QWEN3_LIKE);
    assert_eq!(
        t.render(&m, true, false).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        t.render(&m, true, true).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_style_with_bos_and_date() {
    let m = [
        Message::new("system", "  Be kind.  "),
        Message::new("user", " Hi "),
    ];
    let out = jinja(LLAMA3_LIKE).render(&m, true, false).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let today = lmi_text::chat::strftime(now, "%d %b %Y");
    assert_eq!(
        out,
        format!(
            "<s><|start_header_id|>system<|end_header_id|>\n\n\
             Cutting Knowledge Date: December 2023\nToday Date: {today}\n\n\
             Be kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\
             Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    );
}

#[test]
fn content_parts_are_hf_style_dicts() {
    let m: Vec<Message> = serde_json::from_str(
        r#"[{"role":"user","content":[{"type":"image","image":"a.png"},{"type":"text","text":"What?"}]}]"#,
    )
    .unwrap();
    assert_eq!(
        render(QWEN2_VL_LIKE, &m, true),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn python_string_methods_and_tojson() {
    let src = "{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.startswith(' a') }}|\
               {{ m.content.split(',') | length }}|{{ m | tojson }}{% endfor %}";
    let out = render(src, &[Message::new("user", " a,b ")], false);
    assert_eq!(out, r#"A,B|True|2|{"content": " a,b ", "role": "user"}"#);
}

#[test]
fn loop_controls_work() {
    let src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    let out = render(
        src,
        &[Message::new("user", "a"), Message::new("user", "b")],
        false,
    );
    assert_eq!(out, "a");
}

/// Gemma 3's (google/gemma-3-4b-it, tokenizer_config.json): the system prompt folded into the
/// first user turn, `model` for the assistant, contents trimmed, roles checked to alternate.
pub const GEMMA3: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

#[test]
fn gemma3_folds_the_system_prompt_and_checks_alternation() {
    let m = [
        Message::new("system", "Be terse."),
        Message::new("user", " Hi "),
        Message::new("assistant", "Hello."),
        Message::new("user", "Bye"),
    ];
    let t = JinjaChatTemplate::new(GEMMA3, Some("<bos>"), Some("<eos>")).unwrap();
    assert_eq!(
        t.render(&m, true, false).unwrap(),
        "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n\
         <start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    let err = t
        .render(
            &[Message::new("user", "a"), Message::new("user", "b")],
            true,
            false,
        )
        .unwrap_err();
    assert!(
        matches!(&err, TextError::TemplateRaised(m) if m.contains("must alternate")),
        "{err:?}"
    );
}

#[test]
fn raise_exception_becomes_template_raised() {
    let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
    let err = jinja(src)
        .render(&[Message::new("assistant", "x")], false, false)
        .unwrap_err();
    assert!(
        matches!(&err, TextError::TemplateRaised(m) if m == "Conversation must start with user"),
        "{err:?}"
    );
    assert_eq!(render(src, &[Message::new("user", "x")], false), "ok");
}

#[test]
fn syntax_errors_fail_at_load_and_name_the_problem() {
    let err =
        JinjaChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None).unwrap_err();
    assert!(matches!(err, TextError::Template(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("syntax error") && text.contains("chat_template:1"),
        "{text}"
    );
}

#[test]
fn missing_special_tokens_render_empty() {
    let t = JinjaChatTemplate::new("[{{ bos_token }}{{ eos_token }}]", None, None).unwrap();
    assert_eq!(t.render(&[], false, false).unwrap(), "[]");
}

/// gpt-oss's harmony template (llama.cpp's copy of openai/gpt-oss-120b's) renders as
/// transformers renders it (`templates/render_reference.py`): system and developer messages,
/// tools as a TypeScript namespace, a tool call and its result, channels, the generation prompt.
#[test]
fn gpt_oss_harmony_template_renders_as_transformers_does() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/templates");
    let source = std::fs::read_to_string(dir.join("openai-gpt-oss-120b.jinja")).unwrap();
    let t = JinjaChatTemplate::new(source, None, Some("<|return|>")).unwrap();
    let conversations: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("conversations.json")).unwrap())
            .unwrap();
    for (name, c) in conversations.as_object().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(c["messages"].clone()).unwrap();
        let tools = c["tools"].as_array().map(Vec::as_slice);
        let kwargs = c["kwargs"].as_object().cloned().unwrap_or_default();
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let got = t
            .render_with_kwargs(&messages, tools, add, &kwargs)
            .unwrap();
        let got: Vec<&str> = got
            .split('\n')
            .map(|l| {
                if l.starts_with("Current date: ") {
                    "Current date: YYYY-MM-DD"
                } else {
                    l
                }
            })
            .collect();
        let want =
            std::fs::read_to_string(dir.join(format!("openai-gpt-oss-120b.{name}.txt"))).unwrap();
        assert_eq!(got.join("\n"), want, "{name}");
    }
}
