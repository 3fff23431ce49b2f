//! Speculative decoding. Before a decode step a sequence may take a draft of k tokens (from
//! the client's prediction, or by prompt lookup); its chunk is then the last sampled token
//! plus the draft, the engine draws at each of the k + 1 positions with the context the
//! sequence would have had (the seeded draw is keyed by output position), and the longest
//! prefix of the draft equal to those draws is kept, plus the draw after it.
//!
//! Drafts here are single token sequences (a point mass), for which "draw from the target,
//! accept while the draw equals the draft" *is* the rejection-sampling rule: the draft token
//! is kept with probability p(draft), and otherwise the draw is distributed as p without the
//! draft token. So sampled requests keep their distribution, and with the same seed every
//! request, greedy or not, gives exactly the tokens it gives without speculation.
//!
//! How many tokens to draft: the step's spare rows (`step_rows` less the running sequences;
//! none once the batch is that large, where extra rows are no longer almost free) shared
//! among the sequences, and per sequence a length that doubles while whole drafts are kept
//! and falls back to what was accepted + 1 otherwise.

use super::draft_model::DraftKv;

/// Where a draft came from (metrics are kept per source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftSource {
    /// The client's draft: OpenAI `prediction`, TensorRT-LLM `draft_input_ids`.
    #[default]
    Client = 0,
    /// N-gram match against the prompt and the output so far.
    PromptLookup = 1,
    /// The draft model (option.speculative_draft_model).
    Model = 2,
    /// The checkpoint's multi-token-prediction layer (option.speculative_mtp).
    Mtp = 3,
}

impl DraftSource {
    pub const ALL: [DraftSource; 4] = [
        DraftSource::Client,
        DraftSource::PromptLookup,
        DraftSource::Model,
        DraftSource::Mtp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DraftSource::Client => "client",
            DraftSource::PromptLookup => "prompt_lookup",
            DraftSource::Model => "draft_model",
            DraftSource::Mtp => "mtp",
        }
    }
}

/// Prompt lookup: the longest suffix of the sequence (`max` down to `min` tokens) found
/// earlier in it proposes the tokens that followed, at most `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramLookup {
    pub min: usize,
    pub max: usize,
    pub k: usize,
}

impl Default for NgramLookup {
    fn default() -> Self {
        NgramLookup {
            min: 2,
            max: 4,
            k: 8,
        }
    }
}

impl std::str::FromStr for NgramLookup {
    type Err = String;

    /// `true` (the defaults), or `MIN-MAX:K` (e.g. `2-4:8`), or `N:K`.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("true") {
            return Ok(Self::default());
        }
        let bad = || format!("\"{s}\": expected true, MIN-MAX:K (e.g. 2-4:8) or N:K");
        let (sizes, k) = s.split_once(':').ok_or_else(bad)?;
        let (min, max) = sizes.split_once('-').unwrap_or((sizes, sizes));
        let num = |v: &str| v.trim().parse::<usize>().map_err(|_| bad());
        let g = NgramLookup {
            min: num(min)?,
            max: num(max)?,
            k: num(k)?,
        };
        if g.min == 0 || g.min > g.max || g.k == 0 {
            return Err(format!(
                "\"{s}\": sizes must satisfy 1 <= MIN <= MAX and K >= 1"
            ));
        }
        Ok(g)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Prompt lookup for every request (option.speculative_ngram); off when None. Client
    /// drafts are used whenever a request has one.
    pub ngram: Option<NgramLookup>,
    /// Most draft tokens of one sequence in one step.
    pub max_draft: usize,
    /// Speculation fills a step up to this many rows (running sequences + drafts): below it a
    /// step costs about the same (the CPU's matrix units pad to 16 rows; a GPU is memory bound
    /// well past it). At this batch size or more it is off.
    pub step_rows: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig {
            ngram: None,
            max_draft: 15,
            step_rows: 16,
        }
    }
}

/// Speculative decoding's state for one sequence, kept beside it (see `SeqEntry`).
#[derive(Debug, Clone)]
pub(crate) struct SpecState {
    /// The sequence's last `draft_len` tokens are a draft not verified yet.
    pub draft_len: usize,
    pub source: DraftSource,
    /// The next draft's length (adapted to what was accepted).
    pub spec_k: usize,
    pub accepted: usize,
    pub rejected: usize,
    /// This sequence in the draft model's cache, and its proposal.
    pub draft_kv: DraftKv,
    /// The engine's multi-token-prediction head's proposal after the sequence's last step
    /// (`StepOutput::drafts`).
    pub mtp: Vec<u32>,
}

impl Default for SpecState {
    fn default() -> Self {
        SpecState {
            draft_len: 0,
            source: DraftSource::Client,
            spec_k: 4,
            accepted: 0,
            rejected: 0,
            draft_kv: DraftKv::default(),
            mtp: Vec::new(),
        }
    }
}

impl SpecState {
    /// A fork's: the same draft length to try next, no draft, counts or draft cache.
    pub fn fork(&self) -> Self {
        SpecState {
            source: self.source,
            spec_k: self.spec_k,
            ..SpecState::default()
        }
    }

    /// Records that `accepted` of a `draft_len` draft were kept: the next draft doubles while
    /// drafts are kept whole, and falls back to what was accepted + 1 otherwise.
    pub fn settle(&mut self, accepted: usize, max_draft: usize) {
        let k = self.draft_len;
        self.accepted += accepted;
        self.rejected += k - accepted;
        self.spec_k = if accepted == k {
            (k * 2).min(max_draft)
        } else {
            accepted + 1
        };
        self.draft_len = 0;
    }
}

/// The tokens that followed the most recent earlier occurrence in `corpus` of the longest
/// suffix of `tokens` (`max` down to `min` long), at most `k`. When `corpus` is `tokens`
/// itself the suffix's own position does not count.
pub(crate) fn lookup<'a>(
    corpus: &'a [u32],
    tokens: &[u32],
    min: usize,
    max: usize,
    k: usize,
) -> Option<&'a [u32]> {
    for n in (min.max(1)..=max.min(tokens.len())).rev() {
        let suffix = &tokens[tokens.len() - n..];
        // A match needs at least one token after it.
        let last_start = corpus.len().checked_sub(n + 1)?;
        if let Some(p) = (0..=last_start)
            .rev()
            .find(|&p| &corpus[p..p + n] == suffix)
        {
            let after = &corpus[p + n..];
            return Some(&after[..k.min(after.len())]);
        }
    }
    None
}

/// A draft of at most `k` tokens for a sequence (`tokens`: prompt then output): the client's,
/// else a model's proposal (`model`: the draft model's or the MTP head's, and which), else
/// prompt lookup's.
pub(crate) fn propose(
    tokens: &[u32],
    prompt_len: usize,
    client: &[u32],
    (model, source): (&[u32], DraftSource),
    ngram: Option<&NgramLookup>,
    k: usize,
) -> Option<(DraftSource, Vec<u32>)> {
    if k == 0 {
        return None;
    }
    if !client.is_empty() {
        let out = &tokens[prompt_len..];
        // The usual case: the output so far follows the prediction.
        let draft = if client.starts_with(out) {
            Some(&client[out.len()..(out.len() + k).min(client.len())])
        } else {
            let g = ngram.copied().unwrap_or_default();
            lookup(client, tokens, g.min, g.max, k)
        };
        if let Some(d) = draft.filter(|d| !d.is_empty()) {
            return Some((DraftSource::Client, d.to_vec()));
        }
    }
    if !model.is_empty() {
        return Some((source, model[..k.min(model.len())].to_vec()));
    }
    let g = ngram?;
    lookup(tokens, tokens, g.min, g.max, k.min(g.k))
        .filter(|d| !d.is_empty())
        .map(|d| (DraftSource::PromptLookup, d.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: (&[u32], DraftSource) = (&[], DraftSource::Model);

    #[test]
    fn lookup_finds_the_latest_longest_match() {
        //            0  1  2  3  4  5  6  7  8
        let toks = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3];
        // Suffix [1,2,3] occurs at 0 and 4; the latest (4) proposes 7, 1, 2.
        assert_eq!(lookup(&toks, &toks, 1, 3, 3), Some(&[7, 1, 2][..]));
        // The suffix's own position never matches.
        assert_eq!(lookup(&[5, 6], &[5, 6], 1, 2, 4), None);
        // A shorter n-gram when the longer one is absent.
        assert_eq!(
            lookup(&[4, 3, 8, 8], &[1, 2, 3], 1, 3, 2),
            Some(&[8, 8][..])
        );
        assert_eq!(lookup(&[4, 3, 8, 8], &[1, 2, 3], 2, 3, 2), None);
    }

    #[test]
    fn client_drafts_follow_the_output_then_fall_back_to_lookup() {
        let prompt = [100, 101];
        let client = [1, 2, 3, 4, 5, 6];
        let mut toks = prompt.to_vec();
        assert_eq!(
            propose(&toks, 2, &client, NONE, None, 4),
            Some((DraftSource::Client, vec![1, 2, 3, 4]))
        );
        toks.extend([1, 2]);
        assert_eq!(
            propose(&toks, 2, &client, NONE, None, 8),
            Some((DraftSource::Client, vec![3, 4, 5, 6]))
        );
        // Diverged ([1, 9]): the output's tail [3, 4] is found in the prediction.
        toks = vec![100, 101, 1, 9, 3, 4];
        assert_eq!(
            propose(&toks, 2, &client, NONE, None, 8),
            Some((DraftSource::Client, vec![5, 6]))
        );
        // Nothing left to predict and no prompt lookup: no draft.
        toks = vec![100, 101, 1, 2, 3, 4, 5, 6];
        assert_eq!(propose(&toks, 2, &client, NONE, None, 8), None);
        let g = NgramLookup::default();
        toks = vec![7, 8, 9, 10, 7, 8];
        assert_eq!(
            propose(&toks, 2, &[], NONE, Some(&g), 2),
            Some((DraftSource::PromptLookup, vec![9, 10]))
        );
    }

    #[test]
    fn ngram_option_parses() {
        assert_eq!("true".parse::<NgramLookup>(), Ok(NgramLookup::default()));
        assert_eq!(
            "1-3:5".parse::<NgramLookup>(),
            Ok(NgramLookup {
                min: 1,
                max: 3,
                k: 5
            })
        );
        assert_eq!(
            "2:4".parse::<NgramLookup>(),
            Ok(NgramLookup {
                min: 2,
                max: 2,
                k: 4
            })
        );
        assert!("3-2:4".parse::<NgramLookup>().is_err());
        assert!("2-4".parse::<NgramLookup>().is_err());
    }
}
