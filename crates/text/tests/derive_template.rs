#[path = "common/templates.rs"]
mod templates;

use lmi_text::{JinjaChatTemplate, JsonChatTemplate, Message, TextError, derive_json_template};
use templates::{LLAMA3_LIKE, QWEN2_VL_LIKE, QWEN3_LIKE, QWEN25, SMOLLM2};

fn conversations() -> Vec<Vec<Message>> {
    let sys = || Message::new("system", "You answer in French.");
    let u1 = || Message::new("user", "What is the capital of France?");
    let a1 = || Message::new("assistant", "Paris.");
    let u2 = || Message::new("user", "And its population?\nRoughly.");
    vec![
        vec![u1()],
        vec![sys(), u1()],
        vec![u1(), a1(), u2()],
        vec![sys(), u1(), a1(), u2()],
        vec![sys(), u1(), a1()],
    ]
}

/// The derived JSON template must render exactly what the Jinja template renders.
fn assert_same_output(src: &str) -> JsonChatTemplate {
    let json = derive_json_template(src, Some("<s>"), Some("</s>")).unwrap();
    let jinja = JinjaChatTemplate::new(src, Some("<s>"), Some("</s>")).unwrap();
    for conv in conversations() {
        for add_gen in [false, true] {
            for thinking in [false, true] {
                assert_eq!(
                    json.render(&conv, add_gen, thinking).unwrap(),
                    jinja.render(&conv, add_gen, thinking).unwrap(),
                    "add_generation_prompt {add_gen}, enable_thinking {thinking}, {conv:?}"
                );
            }
        }
    }
    // The derived template survives a trip through processed_chat_template.json.
    let text = serde_json::to_string_pretty(&json).unwrap();
    assert_eq!(JsonChatTemplate::from_json(&text).unwrap(), json);
    json
}

#[test]
fn smollm2_derives_to_chatml_with_its_default_prompt() {
    let json = assert_same_output(SMOLLM2);
    let expected = JsonChatTemplate::from_json(
        r#"{
          "roles": {
            "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
            "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
            "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
          },
          "generation_prompt": "<|im_start|>assistant\n",
          "default_system_prompt": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        }"#,
    )
    .unwrap();
    assert_eq!(json, expected);
}

#[test]
fn qwen25_derives_its_default_prompt() {
    let json = assert_same_output(QWEN25);
    assert_eq!(
        json.default_system_prompt.as_deref(),
        Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    );
    assert_eq!(json.generation_prompt_thinking, None);
}

#[test]
fn qwen3_like_derives_both_generation_prompts() {
    let json = assert_same_output(QWEN3_LIKE);
    // Same pair as seed 003's Qwen3 example.
    assert_eq!(
        json.generation_prompt,
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        json.generation_prompt_thinking.as_deref(),
        Some("<|im_start|>assistant\n")
    );
    assert_eq!(json.default_system_prompt, None);
}

#[test]
fn qwen2_vl_like_derives_media_formats() {
    let json = assert_same_output(QWEN2_VL_LIKE);
    assert_eq!(
        json.content_types["image"].format,
        "<|vision_start|><|image_pad|><|vision_end|>"
    );
    assert_eq!(
        json.content_types["video"].format,
        "<|vision_start|><|video_pad|><|vision_end|>"
    );
    let jinja = JinjaChatTemplate::new(QWEN2_VL_LIKE, None, None).unwrap();
    let m: Vec<Message> = serde_json::from_str(
        r#"[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image","image":"x.png"},
             {"type":"video","video":"v.mp4"},{"type":"text","text":"B"}]}]"#,
    )
    .unwrap();
    assert_eq!(
        json.render(&m, true, false).unwrap(),
        jinja.render(&m, true, false).unwrap()
    );
}

#[test]
fn text_only_templates_get_no_media_formats() {
    assert!(assert_same_output(SMOLLM2).content_types.is_empty());
}

#[test]
fn inexpressible_template_is_a_derive_error() {
    // Llama 3.1 writes a system header (with an empty system text) even without a system
    // message, which prefix/suffix plus a non-empty default prompt cannot express.
    let err = derive_json_template(LLAMA3_LIKE, Some("<s>"), None).unwrap_err();
    assert!(matches!(err, TextError::Derive(_)), "{err:?}");
    assert!(err.to_string().contains("not a system message"), "{err}");
}

#[test]
fn template_errors_pass_through() {
    let err = derive_json_template("{{ raise_exception('no') }}", None, None).unwrap_err();
    assert!(matches!(err, TextError::TemplateRaised(_)), "{err:?}");
}
