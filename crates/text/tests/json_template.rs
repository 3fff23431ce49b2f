//! Seed 003's three example templates, rendered against strings written out by hand from the
//! seed's rules (prefix + content + suffix per message, system prompt priority, generation
//! prompt at the end).

use lmi_text::{ChatTemplate, Content, ContentPart, JsonChatTemplate, Message, TextError};

const QWEN2: &str = r#"{
  "roles": {
    "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
    "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
    "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
  },
  "generation_prompt": "<|im_start|>assistant\n",
  "default_system_prompt": "You are a helpful assistant"
}"#;

const QWEN2_VL: &str = r#"{
  "roles": {
    "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
    "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
    "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
  },
  "content_types": {
    "image": {"format": "<|vision_start|><|image_pad|><|vision_end|>"}
  },
  "generation_prompt": "<|im_start|>assistant\n",
  "default_system_prompt": "You are a helpful assistant."
}"#;

const QWEN3: &str = r#"{
  "roles": {
    "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
    "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
    "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
  },
  "generation_prompt": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
  "generation_prompt_thinking": "<|im_start|>assistant\n",
  "default_system_prompt": "You are a helpful assistant"
}"#;

fn t(json: &str) -> JsonChatTemplate {
    JsonChatTemplate::from_json(json).unwrap()
}

fn msgs(json: &str) -> Vec<Message> {
    serde_json::from_str(json).unwrap()
}

#[test]
fn qwen2_single_turn_with_system() {
    let m = msgs(
        r#"[{"role":"system","content":"You are a helpful assistant."},
            {"role":"user","content":"Introduce NVIDIA and introduce the CEO of this company."}]"#,
    );
    assert_eq!(
        t(QWEN2).render(&m, true, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nIntroduce NVIDIA and introduce the CEO of this company.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn qwen2_without_system_uses_default() {
    let m = msgs(r#"[{"role":"user","content":"What is machine learning?"}]"#);
    assert_eq!(
        t(QWEN2).render(&m, true, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n\
         <|im_start|>user\nWhat is machine learning?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // Without a generation prompt the conversation just ends after the last suffix.
    assert_eq!(
        t(QWEN2).render(&m, false, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n\
         <|im_start|>user\nWhat is machine learning?<|im_end|>\n"
    );
}

#[test]
fn no_system_prompt_when_neither_given() {
    let mut tpl = t(QWEN2);
    tpl.default_system_prompt = None;
    let m = msgs(r#"[{"role":"user","content":"Hi"}]"#);
    assert_eq!(
        tpl.render(&m, true, false).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn qwen2_multi_turn() {
    let m = msgs(
        r#"[{"role":"system","content":"You are a helpful assistant."},
            {"role":"user","content":"What is the capital of France?"},
            {"role":"assistant","content":"The capital of France is Paris."},
            {"role":"user","content":"What is the population of that city?"}]"#,
    );
    assert_eq!(
        t(QWEN2).render(&m, true, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n\
         <|im_start|>user\nWhat is the population of that city?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn qwen2_vl_images_become_placeholders_in_order() {
    let m = msgs(
        r#"[{"role":"user","content":[
              {"type":"image","image":"image1.jpeg"},
              {"type":"image","image":"image2.jpeg"},
              {"type":"text","text":"Compare these two images and identify the similarities."}]}]"#,
    );
    assert_eq!(
        t(QWEN2_VL).render(&m, true, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\
         <|vision_start|><|image_pad|><|vision_end|>\
         Compare these two images and identify the similarities.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // Text parts before and after an image keep their order.
    let m = msgs(
        r#"[{"role":"system","content":[{"type":"text","text":"Be brief."}]},
            {"role":"user","content":[{"type":"text","text":"A "},
              {"type":"image_url","image_url":{"url":"http://h/x.png"}},{"type":"text","text":" B"}]}]"#,
    );
    assert_eq!(
        t(QWEN2_VL).render(&m, false, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n\
         <|im_start|>user\nA <|vision_start|><|image_pad|><|vision_end|> B<|im_end|>\n"
    );
}

#[test]
fn media_without_a_format_is_an_error() {
    let m = msgs(r#"[{"role":"user","content":[{"type":"video","video":"v.mp4"}]}]"#);
    let err = t(QWEN2_VL).render(&m, true, false).unwrap_err();
    assert!(
        matches!(&err, TextError::MissingContentFormat(k) if k == "video"),
        "{err}"
    );
    let m = msgs(r#"[{"role":"user","content":[{"type":"image","image":"a.png"}]}]"#);
    assert!(matches!(
        t(QWEN2).render(&m, true, false).unwrap_err(),
        TextError::MissingContentFormat(_)
    ));
}

#[test]
fn qwen3_thinking_off_and_on() {
    let m = msgs(r#"[{"role":"user","content":"2+2?"}]"#);
    let head = "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n\
                <|im_start|>user\n2+2?<|im_end|>\n";
    assert_eq!(
        t(QWEN3).render(&m, true, false).unwrap(),
        format!("{head}<|im_start|>assistant\n<think>\n\n</think>\n\n")
    );
    assert_eq!(
        t(QWEN3).render(&m, true, true).unwrap(),
        format!("{head}<|im_start|>assistant\n")
    );
    // A template without a thinking prompt ignores enable_thinking.
    assert_eq!(
        t(QWEN2).render(&m, true, true).unwrap(),
        t(QWEN2).render(&m, true, false).unwrap()
    );
}

#[test]
fn unknown_role_is_named() {
    let m = vec![Message::new("tool", "42")];
    let err = t(QWEN2).render(&m, true, false).unwrap_err();
    assert!(matches!(&err, TextError::UnknownRole(r) if r == "tool"));
    assert!(err.to_string().contains("'tool'"));
}

#[test]
fn raw_concatenates_contents_without_markers() {
    let m = msgs(
        r#"[{"role":"system","content":"S."},
            {"role":"user","content":"What is the capital of France?"},
            {"role":"user","content":[{"type":"image","image":"a.png"},{"type":"text","text":"x"}]}]"#,
    );
    assert_eq!(
        t(QWEN2_VL).render_raw(&m).unwrap(),
        "S.What is the capital of France?<|vision_start|><|image_pad|><|vision_end|>x"
    );
    let tpl = ChatTemplate::Json(t(QWEN2));
    assert!(matches!(
        tpl.render_raw(&m),
        Err(TextError::MissingContentFormat(_))
    ));
    assert_eq!(
        tpl.render_raw(&m[..2]).unwrap(),
        "S.What is the capital of France?"
    );
}

#[test]
fn full_export_file_with_extra_fields_parses() {
    let tpl = t(r#"{
      "model_path": "path/to/model",
      "roles": {"user": {"prefix": "U:", "suffix": "\n"}},
      "content_types": {"audio": {"format": "<audio>"}},
      "generation_prompt": "A:"
    }"#);
    assert_eq!(tpl.model_path.as_deref(), Some("path/to/model"));
    let m = vec![Message::with_content(
        "user",
        Content::Parts(vec![ContentPart::Text { text: "hi".into() }]),
    )];
    assert_eq!(tpl.render(&m, true, false).unwrap(), "U:hi\nA:");
}

#[test]
fn from_model_dir_prefers_processed_json() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "bos_token": "<s>"}"#,
    )
    .unwrap();
    let m = vec![Message::new("user", "Hi")];
    let jinja = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert!(matches!(jinja, ChatTemplate::Jinja(_)));
    assert_eq!(jinja.render(&m, true, false).unwrap(), "<s>Hi");
    std::fs::create_dir(dir.path().join("llm")).unwrap();
    std::fs::write(dir.path().join("llm/processed_chat_template.json"), QWEN2).unwrap();
    let json = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert!(matches!(json, ChatTemplate::Json(_)));
    assert_eq!(
        json.render(&m, true, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn from_model_dir_reads_chat_template_jinja_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "[{{ messages[0].content }}]",
    )
    .unwrap();
    let tpl = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(
        tpl.render(&[Message::new("user", "x")], false, false)
            .unwrap(),
        "[x]"
    );
}
