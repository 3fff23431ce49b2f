//! Reasoning replies on the server: which requests are read for reasoning, and the thinking
//! budget, enforced through the constraint machinery (llguidance): the reply must match
//! `<think>` (unless the prompt opened it), at most `budget` tokens of reasoning that end at
//! the first `</think>`, then the closing tag and the blank line after it, then the answer.
//! When the budget is spent, the only tokens the grammar allows spell the closing tag, so it
//! is forced through and the answer follows.
//!
//! A request's own constraint (a JSON schema, a forced tool call, a regex, a choice, a Lark
//! grammar) then applies to the answer, after the reasoning. Without a budget a constraint
//! covers the whole reply, as before: the model must begin with it.

use lmi_api::openai::ThinkingBudget;
use lmi_api::{ApiError, Constraint};
use lmi_text::ReasoningFormat;

/// How one request's replies are read for reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyReasoning {
    pub format: ReasoningFormat,
    /// The rendered prompt opened the reasoning: replies start inside it.
    pub starts_inside: bool,
}

impl ReplyReasoning {
    pub fn stream(&self) -> lmi_text::ReasoningStream {
        lmi_text::ReasoningStream::new(self.format, self.starts_inside)
    }
}

/// One streamed token's text through a reply's splitter (all answer without one); on the
/// `last` token, what the splitter still holds too.
pub fn split_token(
    thinking: Option<&mut lmi_text::ReasoningStream>,
    text: &str,
    last: bool,
) -> Vec<lmi_text::ReasoningPiece> {
    match thinking {
        Some(t) => {
            let mut p = t.push_token(text);
            if last {
                p.extend(t.finish());
            }
            p
        }
        None => vec![lmi_text::ReasoningPiece::Content(text.to_string())],
    }
}

/// A finished reply read for reasoning (when `reasoning`) and then tool calls (when
/// `tools`: calls are parsed from the answer only); with the count of its reasoning tokens.
pub fn read_reply(
    seq: &lmi_api::SequenceOut,
    reasoning: Option<ReplyReasoning>,
    tools: Option<&lmi_api::openai::ToolSpec>,
    tool_format: lmi_text::ToolCallFormat,
) -> (lmi_api::openai::ChatTurn, usize) {
    let text = crate::tool_calls::reply_text(seq);
    let (thought, answer, count) = match reasoning {
        None => (None, text.to_string(), 0),
        Some(r) => {
            let (thought, answer) = lmi_text::split_reasoning(r.format, text, r.starts_inside);
            // The tokens' own texts, to count those of the reasoning.
            let mut s = r.stream();
            let keep = r.format.reads_special_tokens();
            for t in &seq.tokens {
                s.push_token(if t.special && !keep { "" } else { &t.text });
            }
            (thought, answer, s.reasoning_tokens())
        }
    };
    let mut turn = match tools {
        Some(t) => crate::tool_calls::read_turn(t, tool_format, &answer),
        None => lmi_api::openai::ChatTurn {
            content: answer,
            ..Default::default()
        },
    };
    turn.reasoning = thought;
    (turn, count)
}

/// The reasoning of a request with this rendered prompt, and the constraint it generates
/// under: the request's own, or a budget grammar wrapping it when the budget (the request's,
/// else the server's) is a number of tokens and the prompt has not already closed the
/// reasoning (`enable_thinking: false`). A format without budgets (harmony) refuses a
/// request's budget and leaves the server's unused.
pub fn plan(
    format: Option<ReasoningFormat>,
    prompt: &str,
    request_budget: Option<ThinkingBudget>,
    server_budget: ThinkingBudget,
    constraint: Option<&Constraint>,
) -> Result<(Option<ReplyReasoning>, Option<Constraint>), ApiError> {
    let Some(format) = format else {
        return Ok((None, constraint.cloned()));
    };
    let budget = match request_budget {
        Some(ThinkingBudget::Tokens(_)) if !format.takes_budget() => {
            return Err(ApiError::validation(
                "this model's reasoning (gpt-oss's harmony channels) cannot be held to a \
                 thinking budget: send reasoning_effort (low, medium or high) instead",
            )
            .with_param("thinking_token_budget"));
        }
        _ if !format.takes_budget() => ThinkingBudget::Unlimited,
        b => b.unwrap_or(server_budget),
    };
    let reasoning = ReplyReasoning {
        format,
        starts_inside: format.prompt_opens(prompt),
    };
    let constraint = match budget {
        ThinkingBudget::Tokens(n) if !format.prompt_closes(prompt) => Some(Constraint::Grammar(
            budget_grammar(reasoning, n, constraint)?,
        )),
        _ => constraint.cloned(),
    };
    Ok((Some(reasoning), constraint))
}

/// A Lark string literal.
pub(crate) fn lark_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The budget grammar in llguidance's Lark syntax.
pub fn budget_grammar(
    r: ReplyReasoning,
    budget: usize,
    answer: Option<&Constraint>,
) -> Result<String, ApiError> {
    let f = r.format;
    let open = if r.starts_inside {
        String::new()
    } else {
        lark_string(f.open_tag())
    };
    let tag = lark_string(f.close_tag());
    let after = lark_string(f.after_close());
    let answer = match answer {
        None => "/(?s:.*)/".to_string(),
        Some(c) => answer_rule(c)?,
    };
    if budget == 0 {
        return Ok(format!(
            "start: {open} {tag} {after} answer\nanswer: {answer}\n"
        ));
    }
    // Two readings of the reasoning, each a lexeme of at most `budget` tokens (llguidance
    // counts a lexeme's tokens and drops those over their limit): `cut`, text without the
    // closing tag, after which the tag is forced; and `closed`, the same text with the tag the
    // model wrote itself. One lexeme holds text and tag because lexemes are greedy: text
    // followed by a separate tag lexeme could not see the tag coming. When the budget is
    // spent only `cut` can end, so the tag is forced.
    let text = format!(
        "TEXT: /(?s:.*)/ & ~/(?s:.*{}.*)/",
        regex_syntax::escape(f.close_tag()).replace('/', "\\/")
    );
    Ok(format!(
        "start: {open} reasoning answer\n\
         reasoning: cut {tag} {after} | closed {after}\n\
         cut[max_tokens={budget}]: TEXT\n\
         closed[max_tokens={budget}]: TEXT {tag}\n\
         {text}\n\
         answer: {answer}\n"
    ))
}

/// A request's constraint as the grammar's `answer` rule.
fn answer_rule(c: &Constraint) -> Result<String, ApiError> {
    Ok(match c {
        Constraint::JsonSchema(s) => {
            let mut s = s.clone();
            // As the plain constraint: compact JSON unless the schema says otherwise.
            if let Some(o) = s.as_object_mut() {
                o.entry("x-guidance")
                    .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
            }
            format!("%json {s}")
        }
        Constraint::JsonObject => {
            r#"%json {"type": "object", "x-guidance": {"whitespace_flexible": false}}"#.into()
        }
        Constraint::Regex(re) => {
            regex_syntax::Parser::new().parse(re).map_err(|e| {
                ApiError::validation(format!("the regex cannot be used: invalid regex: {e}"))
            })?;
            format!("/{}/", re.replace('/', "\\/"))
        }
        Constraint::Choice(options) if options.is_empty() => {
            return Err(ApiError::validation(
                "the choice list cannot be used: the choice list is empty",
            ));
        }
        Constraint::Choice(options) => options
            .iter()
            .map(|o| lark_string(o))
            .collect::<Vec<_>>()
            .join(" | "),
        Constraint::Grammar(g) => format!("%lark {{\n{g}\n}}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_scheduler::constraint::{GrammarSpec, Guide, SeqConstraint};

    fn guide(dir: &std::path::Path) -> Guide {
        lmi_checkpoint::testing::write_tiny_tokenizer(dir).unwrap();
        let tok = lmi_text::Tokenizer::from_dir(dir).unwrap();
        Guide::new(dir, tok, 260, &[258]).unwrap()
    }

    fn allowed(c: &mut SeqConstraint) -> Vec<u32> {
        let m = c.mask().unwrap();
        (0..260u32)
            .filter(|&t| m[t as usize / 32] >> (t % 32) & 1 == 1)
            .collect()
    }

    fn feed(c: &mut SeqConstraint, text: &str) {
        for b in text.bytes() {
            let ok = allowed(c);
            assert!(
                ok.contains(&(b as u32)),
                "{:?} refused in {text:?}",
                b as char
            );
            c.commit(b as u32).unwrap();
        }
    }

    fn start(g: &Guide, budget: usize, inside: bool, answer: Option<&Constraint>) -> SeqConstraint {
        let r = ReplyReasoning {
            format: ReasoningFormat::ThinkTags,
            starts_inside: inside,
        };
        let lark = budget_grammar(r, budget, answer).unwrap();
        g.compile(&GrammarSpec::Lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{e}\n{lark}"))
            .start()
    }

    #[test]
    fn the_budget_forces_the_closing_tag_then_frees_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let g = guide(dir.path());
        let mut c = start(&g, 3, false, None);
        assert_eq!(
            allowed(&mut c),
            vec![b'<' as u32],
            "the reply opens the tag"
        );
        feed(&mut c, "<think>ab<");
        // The budget is spent: only the closing tag can follow.
        assert_eq!(allowed(&mut c), vec![b'<' as u32]);
        feed(&mut c, "</think>\n\n");
        let free = allowed(&mut c);
        assert!(
            free.contains(&(b'x' as u32)) && free.contains(&258),
            "{free:?}"
        );
        feed(&mut c, "any answer");

        // Closed before the budget: the blank line is forced, then the answer.
        let mut c = start(&g, 50, false, None);
        feed(&mut c, "<think>a </thin> b</think>");
        assert_eq!(allowed(&mut c), vec![b'\n' as u32]);
        feed(&mut c, "\n\nyes");

        // Opened by the prompt, budget 0: the tag at once.
        let mut c = start(&g, 0, true, None);
        assert_eq!(allowed(&mut c), vec![b'<' as u32]);
        feed(&mut c, "</think>\n\nok");
    }

    #[test]
    fn a_constraint_applies_to_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let g = guide(dir.path());
        let choice = Constraint::Choice(vec!["yes".into(), "no".into()]);
        let mut c = start(&g, 2, true, Some(&choice));
        feed(&mut c, "hm</think>\n\n");
        let next = allowed(&mut c);
        assert_eq!(next, vec![b'n' as u32, b'y' as u32]);
        feed(&mut c, "yes");
        assert_eq!(allowed(&mut c), vec![258], "only the end");
        let schema = Constraint::JsonSchema(serde_json::json!({
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}));
        let mut c = start(&g, 4, true, Some(&schema));
        feed(&mut c, "abcd</think>\n\n{\"a\":1}");
        assert_eq!(allowed(&mut c), vec![258]);
        let mut c = start(&g, 4, true, Some(&Constraint::Regex("[0-9]+/x".into())));
        feed(&mut c, "</think>\n\n12/x");
        let mut c = start(
            &g,
            4,
            true,
            Some(&Constraint::Grammar("start: \"A\" | \"B\"".into())),
        );
        feed(&mut c, "</think>\n\nB");
    }
}
