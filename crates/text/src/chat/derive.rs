//! Deriving the seed-003 JSON template from a Jinja template, as TensorRT Edge-LLM's export
//! does: render probe conversations whose contents are sentinels and cut the output around them.

use std::collections::BTreeMap;

use super::jinja::JinjaChatTemplate;
use super::json_template::{ContentTypeFormat, JsonChatTemplate, RoleFormat};
use super::message::{Content, ContentPart, Message};
use crate::error::{Result, TextError};

const SYS: &str = "<<SYS>>";
const USER: &str = "<<USER>>";
const ASSISTANT: &str = "<<ASSISTANT>>";
const USER2: &str = "<<USER2>>";

/// Derives a [`JsonChatTemplate`] whose `render` reproduces the Jinja template for
/// conversations of system/user/assistant messages in the usual order.
///
/// Fails where the template's output cannot be written as prefix + content + suffix per role
/// (e.g. a BOS that goes before whichever message comes first, or an injected system block
/// that is not the system role's prefix/suffix around some text).
pub fn derive_json_template(
    jinja_source: &str,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<JsonChatTemplate> {
    let jinja = JinjaChatTemplate::new(jinja_source, bos_token, eos_token)?;
    let render =
        |msgs: &[Message], add_gen: bool, thinking: bool| jinja.render(msgs, add_gen, thinking);

    // [system, user, assistant, user]: every boundary between roles appears once.
    let full = [
        Message::new("system", SYS),
        Message::new("user", USER),
        Message::new("assistant", ASSISTANT),
        Message::new("user", USER2),
    ];
    let text = render(&full, false, false)?;
    let cut = split_around(&text, &[SYS, USER, ASSISTANT, USER2])?;
    let (system_prefix, sys_to_user, user_to_asst, asst_to_user, user_suffix) =
        (cut[0], cut[1], cut[2], cut[3], cut[4]);

    let assistant_prefix = user_to_asst.strip_prefix(user_suffix).ok_or_else(|| {
        derive_err(
            "the text between a user and an assistant message does not start with the user suffix",
        )
    })?;

    // sys_to_user = system suffix + user prefix; a system-only render tells where to cut.
    // Templates that reject it get the whole boundary as user prefix (same output whenever a
    // user message follows the system message, which is the case that matters).
    let system_suffix = match render(&full[..1], false, false) {
        Ok(t) => {
            let cut = split_around(&t, &[SYS])?;
            if cut[0] == system_prefix && sys_to_user.starts_with(cut[1]) {
                cut[1].to_owned()
            } else {
                String::new()
            }
        }
        Err(_) => String::new(),
    };
    let system_suffix = system_suffix.as_str();
    let user_prefix = &sys_to_user[system_suffix.len()..];
    let assistant_suffix = asst_to_user.strip_suffix(user_prefix).ok_or_else(|| {
        derive_err(
            "the text between an assistant and a user message does not end with the user prefix",
        )
    })?;

    let roles = BTreeMap::from([
        ("system".to_owned(), role(system_prefix, system_suffix)),
        ("user".to_owned(), role(user_prefix, user_suffix)),
        (
            "assistant".to_owned(),
            role(assistant_prefix, assistant_suffix),
        ),
    ]);

    // What the template writes before the user's turn when there is no system message.
    let user_only = [Message::new("user", USER)];
    let text = render(&user_only, false, false)?;
    let cut = split_around(&text, &[USER])?;
    let injected = cut[0]
        .strip_suffix(user_prefix)
        .ok_or_else(|| derive_err("a user-only conversation does not contain the user prefix"))?;
    let default_system_prompt = if injected.is_empty() {
        None
    } else {
        let inner = injected
            .strip_prefix(system_prefix)
            .and_then(|s| s.strip_suffix(system_suffix))
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                derive_err(&format!(
                    "without a system message the template writes {injected:?}, which is not a system message"
                ))
            })?;
        Some(inner.to_owned())
    };

    let conv = &full[..2];
    let plain = render(conv, false, false)?;
    let generation_prompt = generation_suffix(&plain, &render(conv, true, false)?)?;
    let thinking_prompt = generation_suffix(&plain, &render(conv, true, true)?)?;
    let generation_prompt_thinking =
        (thinking_prompt != generation_prompt).then_some(thinking_prompt);

    let mut content_types = BTreeMap::new();
    for media in [
        ContentPart::Image {
            image: "probe.png".into(),
        },
        ContentPart::Video {
            video: "probe.mp4".into(),
        },
    ] {
        if let Some(format) = media_format(&render, &plain, media.clone()) {
            content_types.insert(media.kind().to_owned(), ContentTypeFormat { format });
        }
    }

    Ok(JsonChatTemplate {
        model_path: None,
        roles,
        content_types,
        generation_prompt,
        generation_prompt_thinking,
        default_system_prompt,
    })
}

/// The placeholder a media part becomes: render a user turn of [media, text] and take what
/// appears before the text beyond the text-only render. None when the template cannot take
/// part lists or writes nothing for the media.
fn media_format(
    render: &impl Fn(&[Message], bool, bool) -> Result<String>,
    plain: &str,
    media: ContentPart,
) -> Option<String> {
    let msgs = [
        Message::new("system", SYS),
        Message::with_content(
            "user",
            Content::Parts(vec![media, ContentPart::Text { text: USER.into() }]),
        ),
    ];
    let with_media = render(&msgs, false, false).ok()?;
    let before_plain = &plain[..plain.find(USER)?];
    let before_media = &with_media[..with_media.find(USER)?];
    let format = before_media.strip_prefix(before_plain)?;
    let after_ok = with_media[before_media.len()..] == plain[before_plain.len()..];
    (after_ok && !format.is_empty()).then(|| format.to_owned())
}

fn generation_suffix(without: &str, with: &str) -> Result<String> {
    with.strip_prefix(without)
        .map(str::to_owned)
        .ok_or_else(|| {
            derive_err("add_generation_prompt changes text before the end of the conversation")
        })
}

/// Splits `text` at each sentinel (each must occur exactly once, in order); returns the
/// n + 1 pieces between them.
fn split_around<'a>(text: &'a str, sentinels: &[&str]) -> Result<Vec<&'a str>> {
    let mut pieces = Vec::with_capacity(sentinels.len() + 1);
    let mut rest = text;
    for s in sentinels {
        if text.matches(s).count() != 1 {
            return Err(derive_err(&format!(
                "the probe content {s} appears {} times in the rendered template, expected once",
                text.matches(s).count()
            )));
        }
        let at = rest
            .find(s)
            .ok_or_else(|| derive_err(&format!("the probe content {s} is out of order")))?;
        pieces.push(&rest[..at]);
        rest = &rest[at + s.len()..];
    }
    pieces.push(rest);
    Ok(pieces)
}

fn role(prefix: &str, suffix: &str) -> RoleFormat {
    RoleFormat {
        prefix: prefix.to_owned(),
        suffix: suffix.to_owned(),
    }
}

fn derive_err(msg: &str) -> TextError {
    TextError::Derive(msg.to_owned())
}
