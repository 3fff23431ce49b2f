use lmi_api::{FinishReason, GenerationOut, SequenceOut, TokenOut};

pub fn tok(id: u32, text: &str, lp: f32) -> TokenOut {
    TokenOut::new(id, text, Some(lp), false)
}

pub fn seq(text: &str, finish: FinishReason, tokens: Vec<TokenOut>) -> SequenceOut {
    SequenceOut {
        text: text.into(),
        finish_reason: finish,
        generated_tokens: tokens.len(),
        tokens,
        top_tokens: Vec::new(),
        seed: None,
        accepted_draft_tokens: 0,
        rejected_draft_tokens: 0,
    }
}

pub fn out(inputs: &str, prompt_tokens: usize, best: SequenceOut) -> GenerationOut {
    GenerationOut {
        inputs: inputs.into(),
        prompt_tokens,
        prefill: Vec::new(),
        prefill_top: Vec::new(),
        best,
        others: Vec::new(),
    }
}

/// "Hello world" from "This is a wonderful day" (LMI's own formatter test case).
pub fn hello() -> GenerationOut {
    let tokens = vec![
        tok(244, "He", -0.5),
        tok(30, "llo", -0.25),
        tok(4558, " world", -1.5),
    ];
    out(
        "This is a wonderful day",
        5,
        seq("Hello world", FinishReason::Length, tokens),
    )
}

pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).expect("test JSON")
}
