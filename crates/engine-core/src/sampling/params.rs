//! Per-request sampling controls and their validation.

/// Temperatures at or below this are greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPS: f32 = 1e-5;

/// The sampling controls of one sequence. See the module docs for the order they apply in.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `<= 1e-5` (or 0) means greedy: argmax, ties to the lowest id.
    pub temperature: f32,
    /// Keep the `top_k` most probable tokens; 0 = off.
    pub top_k: u32,
    /// Keep the smallest most-probable set with mass `>= top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens with `p < min_p * p_max`; 0 = off.
    pub min_p: f32,
    /// Locally typical sampling (HF `TypicalLogitsWarper`); 1.0 = off.
    pub typical_p: f32,
    /// HF/CTRL penalty on tokens seen in prompt or output; 1.0 = off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty on tokens seen in the output; 0 = off.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty (times the output count); 0 = off.
    pub frequency_penalty: f32,
    /// Ban tokens that would repeat an n-gram of prompt + output (HF semantics); 0 = off.
    pub no_repeat_ngram_size: u32,
    /// `(token, bias)` added to the logits (TRT-LLM `embedding_bias`, OpenAI `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Banned token sequences (TRT-LLM `bad_words_list`).
    pub bad_words: Vec<Vec<u32>>,
    /// Stop ids are masked until the output has this many tokens (TRT-LLM `min_length`).
    pub min_new_tokens: u32,
    /// Seed of the counter-based RNG (see [`super::uniform`]).
    pub seed: u64,
    /// Number of `(id, logprob)` alternatives to report; 0 = none.
    pub top_logprobs: u32,
    /// Whether the sampled token's logprob is wanted. When it is not (and `top_logprobs` is 0)
    /// the host sampler skips the row's log-normalizer, an exponential per vocabulary entry,
    /// and reports the logprob as NaN.
    pub logprob: bool,
}

impl Default for SamplingParams {
    /// Greedy with every control off, seed 0.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            no_repeat_ngram_size: 0,
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
            min_new_tokens: 0,
            seed: 0,
            top_logprobs: 0,
            logprob: true,
        }
    }
}

impl SamplingParams {
    /// True when the token is the argmax (temperature `<= 1e-5`).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_EPS
    }

    /// Whether sampling must compute the row's log-normalizer: a logprob or alternatives.
    pub fn needs_logprobs(&self) -> bool {
        self.logprob || self.top_logprobs > 0
    }

    /// Checks every field; the error message names the field and says what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        fn check(ok: bool, field: &str, rule: &str, got: f32) -> Result<(), String> {
            if ok {
                Ok(())
            } else {
                Err(format!("{field} must be {rule}, got {got}"))
            }
        }
        let t = self.temperature;
        check(
            t.is_finite() && t >= 0.0,
            "temperature",
            "a finite number >= 0",
            t,
        )?;
        let p = self.top_p;
        check(p > 0.0 && p <= 1.0, "top_p", "in (0, 1]", p)?;
        let m = self.min_p;
        check((0.0..=1.0).contains(&m), "min_p", "in [0, 1]", m)?;
        let ty = self.typical_p;
        check(ty > 0.0 && ty <= 1.0, "typical_p", "in (0, 1]", ty)?;
        let r = self.repetition_penalty;
        check(
            r.is_finite() && r > 0.0,
            "repetition_penalty",
            "a finite number > 0",
            r,
        )?;
        let pp = self.presence_penalty;
        check(pp.is_finite(), "presence_penalty", "a finite number", pp)?;
        let fp = self.frequency_penalty;
        check(fp.is_finite(), "frequency_penalty", "a finite number", fp)?;
        for &(id, b) in &self.logit_bias {
            check(
                b.is_finite(),
                &format!("logit_bias[{id}]"),
                "a finite number",
                b,
            )?;
        }
        if let Some(i) = self.bad_words.iter().position(Vec::is_empty) {
            return Err(format!(
                "bad_words[{i}] must contain at least one token, got an empty list"
            ));
        }
        Ok(())
    }
}
