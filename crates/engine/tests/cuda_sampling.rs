//! The CUDA sampler (`CudaBackend::process_logits`, kernels/sampling.cu) against the CPU's
//! `sampling::process_logits_host` on the same logits: tokens must be equal, log-probabilities
//! within 1e-4, top-n lists equal in ids. Every case runs on the emulator in both thread
//! orders (and on a GPU when one is present). Constrained draws (a `TokenMask`) must also stay
//! inside their mask whenever it allows a token of the vocabulary.

mod cuda_common;

use lmi_cuda::Device;
use lmi_engine::Backend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::sampling::{SamplingParams, SequenceContext, derive_seed, sample_seeded, weight};
use lmi_engine::step::{
    LogitsOutput, LogitsWork, RowSample, RowScore, TokenMask, process_logits_host,
};

const LOGPROB_TOL: f32 = 1e-4;

/// xorshift64 for test contexts and parameters.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 11) % n.max(1)
    }
    fn tokens(&mut self, len: usize, vocab: usize) -> Vec<u32> {
        (0..len).map(|_| self.below(vocab as u64) as u32).collect()
    }
}

/// One draw of a case, owning its context.
struct Draw {
    row: usize,
    params: SamplingParams,
    seed: u64,
    prompt: Vec<u32>,
    output: Vec<u32>,
    stop: Vec<u32>,
    allowed: Option<TokenMask>,
}

impl Draw {
    fn new(row: usize, params: SamplingParams, seed: u64) -> Self {
        Draw {
            row,
            params,
            seed,
            prompt: Vec::new(),
            output: Vec::new(),
            stop: Vec::new(),
            allowed: None,
        }
    }

    fn masked(row: usize, params: SamplingParams, seed: u64, bits: &[u32]) -> Self {
        let mut d = Draw::new(row, params, seed);
        d.allowed = Some(TokenMask::ready(bits.to_vec()));
        d
    }
}

/// A mask of `words` words allowing `tokens` (those past its end are dropped).
fn mask_of(tokens: impl IntoIterator<Item = u32>, words: usize) -> Vec<u32> {
    let mut bits = vec![0u32; words];
    for t in tokens {
        if let Some(w) = bits.get_mut(t as usize / 32) {
            *w |= 1 << (t % 32);
        }
    }
    bits
}

fn is_allowed(bits: &[u32], token: u32) -> bool {
    bits.get(token as usize / 32)
        .is_some_and(|w| w & (1 << (token % 32)) != 0)
}

struct Case {
    name: String,
    vocab: usize,
    logits: Vec<f32>,
    draws: Vec<Draw>,
    scores: Vec<RowScore>,
}

impl Case {
    fn new(name: impl Into<String>, vocab: usize, rows: Vec<Vec<f32>>) -> Self {
        assert!(rows.iter().all(|r| r.len() == vocab));
        Case {
            name: name.into(),
            vocab,
            logits: rows.concat(),
            draws: Vec::new(),
            scores: Vec::new(),
        }
    }
}

fn sampled(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..SamplingParams::default()
    }
}

fn with_top(mut p: SamplingParams, n: u32) -> SamplingParams {
    p.top_logprobs = n;
    p
}

fn rows(n: usize, vocab: usize, seed: u64, scale: f32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| cuda_common::random(vocab, seed * 7919 + i as u64, scale))
        .collect()
}

#[track_caller]
fn assert_logprob(what: &str, got: f32, want: f32) {
    let ok = got == want || (got - want).abs() <= LOGPROB_TOL;
    assert!(ok, "{what}: logprob {got}, CPU {want}");
}

#[track_caller]
fn assert_top(what: &str, got: &[(u32, f32)], want: &[(u32, f32)]) {
    let ids = |v: &[(u32, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
    assert_eq!(ids(got), ids(want), "{what}: top-n ids");
    for (g, w) in got.iter().zip(want) {
        assert_logprob(&format!("{what}: top-n token {}", w.0), g.1, w.1);
    }
}

/// Runs `case` on the device and on the host and compares.
fn check_case<D: Device>(b: &CudaBackend<D>, case: &Case) {
    let vocab = case.vocab;
    let n_rows = case.logits.len().checked_div(vocab).unwrap_or(0);
    let samples: Vec<RowSample> = case
        .draws
        .iter()
        .map(|d| RowSample {
            row: d.row,
            params: &d.params,
            seed: d.seed,
            ctx: SequenceContext {
                prompt: &d.prompt,
                output: &d.output,
                stop_ids: &d.stop,
            },
            allowed: d.allowed.as_ref(),
        })
        .collect();
    let work = LogitsWork {
        samples,
        scores: case.scores.clone(),
    };
    let buf = b.upload_f32(&case.logits).unwrap();
    let got: LogitsOutput = b.process_logits(buf, n_rows, vocab, &work).unwrap();
    let mut host = case.logits.clone();
    let want = process_logits_host(&mut host, vocab, &work);
    assert_eq!(got.samples.len(), want.samples.len(), "{}", case.name);
    assert_eq!(got.scores.len(), want.scores.len(), "{}", case.name);
    for (i, (g, w)) in got.samples.iter().zip(&want.samples).enumerate() {
        let what = format!("{} draw {i} ({:?})", case.name, case.draws[i].params);
        assert_eq!(g.token, w.token, "{what}: token");
        // Not only equal to the CPU: inside the mask whenever it allows anything.
        if let Some(bits) = case.draws[i].allowed.as_ref().and_then(TokenMask::wait)
            && (0..vocab as u32).any(|t| is_allowed(&bits, t))
        {
            assert!(
                is_allowed(&bits, g.token),
                "{what}: token {} is masked",
                g.token
            );
            for &(t, _) in &g.top {
                assert!(is_allowed(&bits, t), "{what}: top-n token {t} is masked");
            }
        }
        assert_logprob(&what, g.logprob, w.logprob);
        assert_top(&what, &g.top, &w.top);
    }
    for (i, (g, w)) in got.scores.iter().zip(&want.scores).enumerate() {
        let what = format!("{} score {i} ({:?})", case.name, case.scores[i]);
        assert_logprob(&what, g.logprob, w.logprob);
        assert_top(&what, &g.top, &w.top);
    }
}

fn check_all<D: Device>(b: &CudaBackend<D>, cases: &[Case]) {
    for case in cases {
        check_case(b, case);
    }
}

// ---- Cases -------------------------------------------------------------------------------------

/// Greedy and plain temperature over vocabularies from 1 to 50K, several seeds per row.
fn greedy_and_temperature_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (k, &vocab) in [1usize, 2, 7, 33, 100, 1000, 4099, 50_000]
        .iter()
        .enumerate()
    {
        let mut c = Case::new(
            format!("vocab {vocab}"),
            vocab,
            rows(3, vocab, k as u64 + 1, 8.0),
        );
        c.draws
            .push(Draw::new(0, with_top(SamplingParams::default(), 3), 0));
        c.draws.push(Draw::new(1, sampled(1.0), 11));
        c.draws.push(Draw::new(2, with_top(sampled(0.7), 5), 12));
        if vocab >= 1000 {
            for seed in 0..4 {
                c.draws
                    .push(Draw::new(seed as usize % 3, sampled(1.3), 100 + seed));
            }
            c.draws.push(Draw::new(0, sampled(0.05), 7));
            c.draws.push(Draw::new(1, sampled(40.0), 8));
        }
        cases.push(c);
    }
    cases
}

/// Each filter alone and combined, at several strengths.
fn filter_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (k, &vocab) in [50usize, 3000, 50_000].iter().enumerate() {
        let spread = [4.0, 10.0, 12.0][k];
        let mut c = Case::new(
            format!("filters, vocab {vocab}"),
            vocab,
            rows(4, vocab, 50 + k as u64, spread),
        );
        let mut seed = 1000 * k as u64;
        let mut add = |c: &mut Case, f: &dyn Fn(&mut SamplingParams)| {
            for t in [0.6f32, 1.0, 1.7] {
                let mut p = sampled(t);
                f(&mut p);
                seed += 1;
                let row = (seed % 4) as usize;
                c.draws.push(Draw::new(row, p, seed));
            }
        };
        for top_k in [1u32, 2, 5, 40, 700, 10_000] {
            add(&mut c, &|p| p.top_k = top_k);
        }
        for top_p in [0.05f32, 0.5, 0.9, 0.999] {
            add(&mut c, &|p| p.top_p = top_p);
        }
        for min_p in [0.01f32, 0.2, 0.9, 1.0] {
            add(&mut c, &|p| p.min_p = min_p);
        }
        for typical_p in [0.1f32, 0.5, 0.95] {
            add(&mut c, &|p| p.typical_p = typical_p);
        }
        add(&mut c, &|p| {
            p.top_k = 50;
            p.top_p = 0.9;
        });
        add(&mut c, &|p| {
            p.min_p = 0.05;
            p.top_k = 200;
            p.top_p = 0.8;
            p.typical_p = 0.9;
        });
        add(&mut c, &|p| {
            p.min_p = 0.02;
            p.typical_p = 0.7;
            p.top_logprobs = 4;
        });
        cases.push(c);
    }
    cases
}

/// Penalties, bias and bans from random contexts, on greedy and sampled draws.
fn processor_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    for (k, &vocab) in [20usize, 500, 20_000].iter().enumerate() {
        let mut c = Case::new(
            format!("processors, vocab {vocab}"),
            vocab,
            rows(3, vocab, 90 + k as u64, 5.0),
        );
        for j in 0..24u64 {
            let mut p = if j % 3 == 0 {
                SamplingParams::default()
            } else {
                sampled(0.8 + (j % 4) as f32 * 0.3)
            };
            p.top_logprobs = (j % 5) as u32 * 3;
            let v = vocab as u64;
            match j % 8 {
                0 => p.repetition_penalty = 1.3,
                1 => p.repetition_penalty = 0.7,
                2 => {
                    p.presence_penalty = 0.6;
                    p.frequency_penalty = 0.4;
                }
                3 => {
                    let a = rng.below(v) as u32;
                    p.logit_bias = vec![(a, 3.0), (rng.below(v) as u32, -2.5), (a, 1.25)];
                    p.logit_bias.push((vocab as u32 + 5, 9.0)); // outside the vocabulary
                }
                4 => p.min_new_tokens = 50,
                5 => p.no_repeat_ngram_size = 2 + (j % 3) as u32,
                6 => p.bad_words = Vec::new(), // filled below from the output
                _ => {
                    p.repetition_penalty = 1.2;
                    p.frequency_penalty = -0.3;
                    p.logit_bias = vec![(rng.below(v) as u32, 0.5)];
                    p.no_repeat_ngram_size = 2;
                    p.min_new_tokens = 40;
                }
            }
            // Small contexts over a small id range, so n-grams and repeats occur.
            let range = vocab.min(12);
            let mut d = Draw::new((j % 3) as usize, p, 7000 + j);
            let (prompt_len, output_len) = (10 + rng.below(30) as usize, rng.below(40) as usize);
            d.prompt = rng.tokens(prompt_len, range);
            d.output = rng.tokens(output_len, range);
            d.stop = vec![0, 1, rng.below(v) as u32];
            if j % 8 == 6 {
                let tail = d.output.len().saturating_sub(2);
                d.params.bad_words = vec![
                    vec![rng.below(v) as u32],
                    d.output[tail..].iter().copied().chain([3]).collect(),
                    vec![5, 6, 7],
                ];
            }
            c.draws.push(d);
        }
        // A long context: thousands of edits in one job.
        let mut p = with_top(sampled(1.0), 8);
        p.repetition_penalty = 1.2;
        p.presence_penalty = 0.2;
        p.frequency_penalty = 0.1;
        p.no_repeat_ngram_size = 2;
        let mut d = Draw::new(2, p, 4242);
        d.prompt = rng.tokens(3000, vocab);
        d.output = rng.tokens(500, vocab);
        c.draws.push(d);
        cases.push(c);
    }
    cases
}

/// Rows full of equal logits: greedy ties, top-k and top-n boundaries inside a tie, and
/// a single logit shared by more candidates than the kernel sorts in shared memory.
fn tie_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &vocab in &[64usize, 9000] {
        let quantized: Vec<f32> = cuda_common::random(vocab, 3, 6.0)
            .iter()
            .map(|x| (x * 2.0).round() / 2.0)
            .collect();
        let flat = vec![1.5f32; vocab];
        let mut zeros: Vec<f32> = (0..vocab)
            .map(|i| if i % 2 == 0 { 0.0 } else { -0.0 })
            .collect();
        zeros[vocab - 1] = -1.0;
        let mut c = Case::new(
            format!("ties, vocab {vocab}"),
            vocab,
            vec![quantized, flat, zeros],
        );
        for row in 0..3 {
            c.draws
                .push(Draw::new(row, with_top(SamplingParams::default(), 7), 0));
            for (j, (k, top_p)) in [(3u32, 1.0f32), (0, 0.3), (25, 1.0), (0, 1.0), (4500, 0.7)]
                .into_iter()
                .enumerate()
            {
                let mut p = with_top(sampled(1.0), 5 + j as u32);
                p.top_k = k;
                p.top_p = top_p;
                c.draws.push(Draw::new(row, p, 31 * row as u64 + j as u64));
            }
            let mut p = sampled(0.9);
            p.typical_p = 0.5;
            c.draws.push(Draw::new(row, p, 77));
        }
        cases.push(c);
    }
    cases
}

/// Cumulative masses that land exactly on a filter's boundary (equal logits, so the masses are
/// exact): top-p and typical-p are inclusive, min_p keeps `p == min_p * p_max`.
fn boundary_cases() -> Vec<Case> {
    let flat = vec![0.0f32; 8];
    let mut four_max = vec![-3.0f32; 8];
    four_max[1..5].fill(2.0);
    let mut c = Case::new("exact boundaries", 8, vec![flat, four_max]);
    for row in 0..2 {
        for seed in 0..6u64 {
            for mass in [0.25f32, 0.5, 0.75] {
                let mut p = sampled(1.0);
                p.top_p = mass;
                c.draws.push(Draw::new(row, p, seed));
                let mut p = sampled(1.0);
                p.typical_p = mass;
                c.draws.push(Draw::new(row, p, seed));
            }
            let mut p = sampled(1.0);
            p.min_p = 1.0;
            c.draws.push(Draw::new(row, p, seed));
        }
    }
    vec![c]
}

/// NaN, ±inf, all masked rows, and bans that leave nothing to sample.
fn degenerate_cases() -> Vec<Case> {
    let vocab = 300;
    let base = cuda_common::random(vocab, 17, 4.0);
    let mut with_nan = base.clone();
    for i in (0..vocab).step_by(7) {
        with_nan[i] = f32::NAN;
    }
    with_nan[5] = f32::NEG_INFINITY;
    let mut with_inf = base.clone();
    with_inf[40] = f32::INFINITY;
    with_inf[41] = f32::INFINITY;
    with_inf[3] = f32::NEG_INFINITY;
    let all_neg_inf = vec![f32::NEG_INFINITY; vocab];
    let all_nan = vec![f32::NAN; vocab];
    let mut two_finite = vec![f32::NEG_INFINITY; vocab];
    two_finite[10] = 2.0;
    two_finite[200] = 1.0;
    let rows = vec![with_nan, with_inf, all_neg_inf, all_nan, two_finite];
    let mut c = Case::new("degenerate rows", vocab, rows);
    for row in 0..5 {
        c.draws
            .push(Draw::new(row, with_top(SamplingParams::default(), 4), 0));
        c.draws
            .push(Draw::new(row, with_top(sampled(1.0), 6), 5 + row as u64));
        let mut p = with_top(sampled(0.7), 3);
        p.top_k = 3;
        p.top_p = 0.8;
        c.draws.push(Draw::new(row, p, 9));
        c.scores.push(RowScore {
            row,
            token: 10,
            top_n: 5,
        });
    }
    // Bans that leave nothing: the two finite tokens banned (bad words, then stop ids).
    let mut p = with_top(sampled(1.0), 3);
    p.bad_words = vec![vec![10], vec![200]];
    c.draws.push(Draw::new(4, p, 1));
    let mut p = with_top(SamplingParams::default(), 3);
    p.min_new_tokens = 5;
    p.logit_bias = vec![(200, 4.0)];
    let mut d = Draw::new(4, p, 2);
    d.stop = vec![10, 200, 200];
    c.draws.push(d);
    // Bans on a row that is already all -inf: lifting them changes nothing.
    let mut p = sampled(1.0);
    p.bad_words = vec![vec![1]];
    c.draws.push(Draw::new(2, p, 3));
    // Penalties of an inf logit.
    let mut p = with_top(sampled(1.0), 2);
    p.repetition_penalty = 1.5;
    p.presence_penalty = 1.0;
    let mut d = Draw::new(1, p, 4);
    d.output = vec![40, 3, 3];
    c.draws.push(d);
    vec![c]
}

/// Top-n from 0 to 1024 (and more than the vocabulary), and prompt-token scores.
fn top_n_and_score_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &vocab in &[10usize, 5000, 30_000] {
        let mut c = Case::new(
            format!("top-n, vocab {vocab}"),
            vocab,
            rows(2, vocab, 400, 7.0),
        );
        for (j, n) in [0u32, 1, 2, 17, 100, 513, 1024].into_iter().enumerate() {
            c.draws
                .push(Draw::new(j % 2, with_top(SamplingParams::default(), n), 0));
            c.draws
                .push(Draw::new(j % 2, with_top(sampled(1.1), n), j as u64));
            c.scores.push(RowScore {
                row: j % 2,
                token: (j * 37 % vocab) as u32,
                top_n: n,
            });
        }
        c.scores.push(RowScore {
            row: 1,
            token: vocab as u32 + 3, // outside the row: -inf
            top_n: 2,
        });
        cases.push(c);
    }
    cases
}

/// One row drawn by the parallel sequences of a fork (own seed and context each, some with
/// edits), and scored, in one step.
fn fork_cases() -> Vec<Case> {
    let vocab = 8000;
    let mut c = Case::new("fork", vocab, rows(2, vocab, 600, 6.0));
    let mut rng = Rng(99);
    for i in 0..6u64 {
        let mut p = with_top(sampled(1.0), 3);
        if i % 2 == 1 {
            p.repetition_penalty = 1.4;
            p.logit_bias = vec![(rng.below(vocab as u64) as u32, 5.0)];
            p.bad_words = vec![vec![rng.below(vocab as u64) as u32]];
        }
        let mut d = Draw::new(0, p, derive_seed(42, i));
        d.prompt = rng.tokens(20, vocab);
        d.output = rng.tokens(i as usize, vocab);
        c.draws.push(d);
    }
    // A row edited in place by its only draw, then a greedy fork on the other row.
    let mut p = sampled(0.9);
    p.presence_penalty = 2.0;
    let mut d = Draw::new(1, p, 5);
    d.output = (0..50).collect();
    c.draws.push(d);
    c.scores.push(RowScore {
        row: 0,
        token: 3,
        top_n: 4,
    });
    vec![c]
}

/// Masks of every shape (sparse, dense, one token, none, shorter and longer than the
/// vocabulary) under greedy and every filter.
fn mask_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rng = Rng(0x3a5c_0ffe_e123_4567);
    for (k, &vocab) in [1usize, 33, 300, 5000, 50_000].iter().enumerate() {
        let words = vocab.div_ceil(32);
        let v = vocab as u32;
        let mut c = Case::new(
            format!("masks, vocab {vocab}"),
            vocab,
            rows(2, vocab, 700 + k as u64, 8.0),
        );
        let sparse: Vec<u32> = (0..(vocab / 100).max(3))
            .map(|_| rng.below(vocab as u64) as u32)
            .collect();
        let masks: Vec<(&str, Vec<u32>)> = vec![
            ("sparse", mask_of(sparse, words)),
            ("dense", mask_of((0..v).filter(|t| t % 10 != 3), words)),
            ("one token", mask_of([v / 2], words)),
            ("even ids", mask_of((0..v).step_by(2), words)),
            // Ends at word (words + 1) / 2: the rest of the vocabulary is not allowed.
            ("short", vec![u32::MAX; words.div_ceil(2)]),
            // Extra words, and bits past the vocabulary in its last word.
            ("long", vec![0x5555_5555; words + 3]),
            ("nothing allowed", vec![0; words]),
            ("empty", Vec::new()),
        ];
        let mut seed = 10_000 * k as u64;
        for (name, bits) in &masks {
            let mut add = |f: &dyn Fn(&mut SamplingParams)| {
                seed += 1;
                let mut p = sampled(0.9);
                f(&mut p);
                c.draws
                    .push(Draw::masked((seed % 2) as usize, p, seed, bits));
            };
            add(&|p| *p = with_top(SamplingParams::default(), 5));
            add(&|p| p.top_logprobs = 3);
            add(&|p| p.top_k = 1);
            add(&|p| p.top_k = 5);
            add(&|p| p.top_k = 40);
            add(&|p| p.top_p = 0.5);
            add(&|p| p.top_p = 0.95);
            add(&|p| p.min_p = 0.1);
            add(&|p| p.typical_p = 0.7);
            add(&|p| {
                p.min_p = 0.02;
                p.top_k = 30;
                p.top_p = 0.8;
                p.typical_p = 0.9;
                p.top_logprobs = 4;
            });
            if *name == "sparse" {
                // Far off the mask's logits: the temperature and min_p cutoffs see only its max.
                add(&|p| p.temperature = 0.05);
                add(&|p| p.temperature = 30.0);
            }
        }
        cases.push(c);
    }
    cases
}

/// Bias, penalties and bans on masked rows: edits of masked tokens (a huge bias included) never
/// unmask them, and bans that leave nothing but masked tokens are lifted without unmasking.
/// The greedy draws each edit their own row in place; the sampled ones share two rows, so
/// they edit private copies (which hold only the allowed tokens).
fn masked_processor_cases() -> Vec<Case> {
    let vocab: usize = 4000;
    let words = vocab.div_ceil(32);
    let mut c = Case::new("masks with processors", vocab, rows(8, vocab, 800, 6.0));
    let allowed = [7u32, 64, 65, 1000, 3999];
    let bits = mask_of(allowed, words);
    for (j, greedy) in [true, false].into_iter().enumerate() {
        let base = || {
            if greedy {
                with_top(SamplingParams::default(), 6)
            } else {
                with_top(sampled(1.0), 6)
            }
        };
        let seed = 50 * j as u64;
        let row = |k: usize| if greedy { k } else { 6 + k % 2 };
        // Every allowed token banned (bad words): lifted, the mask stays.
        let mut p = base();
        p.bad_words = allowed.iter().map(|&t| vec![t]).collect();
        p.logit_bias = vec![(3, 80.0), (64, 2.0)];
        c.draws.push(Draw::masked(row(0), p, seed + 1, &bits));
        // Stop ids that are all the allowed tokens (min_new_tokens), plus bans of masked ones.
        let mut p = base();
        p.min_new_tokens = 10;
        p.bad_words = vec![vec![8], vec![9]];
        let mut d = Draw::masked(row(1), p, seed + 2, &bits);
        d.stop = allowed.to_vec();
        d.output = vec![1, 2];
        c.draws.push(d);
        // No-repeat n-grams banning every allowed token, with penalties.
        let mut p = base();
        p.no_repeat_ngram_size = 2;
        p.repetition_penalty = 1.5;
        p.presence_penalty = 0.5;
        let mut d = Draw::masked(row(2), p, seed + 3, &bits);
        d.prompt = allowed.iter().flat_map(|&t| [42, t]).collect();
        d.output = vec![42];
        c.draws.push(d);
        // Some bans leave allowed tokens: no lifting; a huge bias on a masked token.
        let mut p = base();
        p.bad_words = vec![vec![64], vec![1000], vec![12]];
        p.logit_bias = vec![(12, 90.0), (13, 90.0), (65, -1.0)];
        p.frequency_penalty = 0.3;
        let mut d = Draw::masked(row(3), p, seed + 4, &bits);
        d.output = vec![7, 7, 13, 3999];
        c.draws.push(d);
        // A mask allowing nothing, with bans: lifted, still nothing.
        let mut p = base();
        p.bad_words = vec![vec![5]];
        c.draws.push(Draw::masked(row(4), p, seed + 5, &[0; 3]));
        // One allowed token that is banned.
        let mut p = base();
        p.bad_words = vec![vec![1000]];
        c.draws
            .push(Draw::masked(row(5), p, seed + 6, &mask_of([1000], words)));
    }
    vec![c]
}

/// One row drawn by masked and unmasked parallel sequences (some with edits: private copies of
/// a masked row) and scored (scores have no mask), plus a masked draw editing its row in place.
fn masked_fork_cases() -> Vec<Case> {
    let vocab: usize = 6000;
    let words = vocab.div_ceil(32);
    let mut c = Case::new("masked fork", vocab, rows(3, vocab, 900, 6.0));
    let mut rng = Rng(4242);
    for i in 0..8u64 {
        let mut p = with_top(
            if i % 4 == 0 {
                SamplingParams::default()
            } else {
                sampled(1.0)
            },
            4,
        );
        if i % 2 == 1 {
            p.repetition_penalty = 1.3;
            p.logit_bias = vec![(rng.below(vocab as u64) as u32, 6.0)];
            p.bad_words = vec![vec![rng.below(vocab as u64) as u32]];
        }
        let mut d = Draw::new(0, p, derive_seed(7, i));
        d.prompt = rng.tokens(30, vocab);
        d.output = rng.tokens(i as usize, vocab);
        if i % 3 != 2 {
            // Each sequence at its own grammar state: its own mask.
            let allowed: Vec<u32> = (0..40 + 300 * i)
                .map(|_| rng.below(vocab as u64) as u32)
                .chain(d.prompt.iter().copied().take(5))
                .collect();
            d.allowed = Some(TokenMask::ready(mask_of(allowed, words)));
        }
        c.draws.push(d);
    }
    for token in [3u32, 100, 5999] {
        c.scores.push(RowScore {
            row: 0,
            token,
            top_n: 5,
        });
    }
    // The only draw of row 1: masked, edited in place, every allowed token banned.
    let mut p = with_top(sampled(0.8), 3);
    p.bad_words = vec![vec![10], vec![20]];
    p.presence_penalty = 1.0;
    let mut d = Draw::masked(1, p, 3, &mask_of([10, 20], words));
    d.output = vec![10, 10, 30];
    c.draws.push(d);
    // Row 2 scored and drawn once (masked, no edits: no copy needed).
    c.draws.push(Draw::masked(
        2,
        with_top(sampled(1.2), 2),
        9,
        &mask_of((0..vocab as u32).step_by(3), words),
    ));
    c.scores.push(RowScore {
        row: 2,
        token: 1,
        top_n: 3,
    });
    vec![c]
}

// ---- Tests -------------------------------------------------------------------------------------

fn greedy_and_temperature<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &greedy_and_temperature_cases());
}

fn filters<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &filter_cases());
}

fn processors<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &processor_cases());
}

fn ties<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &tie_cases());
}

fn boundaries<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &boundary_cases());
}

fn degenerate<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &degenerate_cases());
}

fn top_n_and_scores<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &top_n_and_score_cases());
}

fn forks<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &fork_cases());
}

fn masks<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &mask_cases());
}

fn masked_processors<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &masked_processor_cases());
}

fn masked_forks<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &masked_fork_cases());
}

/// A Llama-3-sized vocabulary (128,256): spread logits, rows of massive ties (a few distinct
/// values, so ranks fall back to ids), tight masks (one token, three of a tie, the first
/// 4,096), and top-n 4,096 (the kernel's limit) on draws and prompt scores.
fn large_vocabulary_cases() -> Vec<Case> {
    const VOCAB: usize = 128_256;
    let words = VOCAB.div_ceil(32);
    let spread = cuda_common::random(VOCAB, 4242, 12.0);
    // Five distinct values: tens of thousands of tokens share each.
    let ties: Vec<f32> = cuda_common::random(VOCAB, 4343, 2.0)
        .iter()
        .map(|x| x.round())
        .collect();
    let mut c = Case::new("vocab 128256", VOCAB, vec![spread, ties]);
    for row in [0, 1] {
        c.draws
            .push(Draw::new(row, with_top(SamplingParams::default(), 4096), 0));
        c.draws.push(Draw::new(
            row,
            with_top(sampled(1.0), 4096),
            31 + row as u64,
        ));
        let mut p = sampled(0.8);
        p.top_p = 0.9;
        p.top_k = 50;
        c.draws
            .push(Draw::new(row, with_top(p, 8), 41 + row as u64));
        let mut p = sampled(1.2);
        p.min_p = 0.05;
        c.draws.push(Draw::new(row, p, 51 + row as u64));
        c.scores.push(RowScore {
            row,
            token: 128_000,
            top_n: 4096,
        });
    }
    // Tight masks: a single token, three tokens of the tied row's top value, the first 4,096.
    let max_tie = c.logits[VOCAB..].iter().fold(f32::MIN, |m, &x| m.max(x));
    let tied: Vec<u32> = (0..VOCAB as u32)
        .filter(|&t| c.logits[VOCAB + t as usize] == max_tie)
        .step_by(997)
        .take(3)
        .collect();
    assert_eq!(tied.len(), 3);
    let one = mask_of([77_777], words);
    let three = mask_of(tied.iter().copied(), words);
    let first = mask_of(0..4096, words);
    for (row, bits, seed) in [
        (0, &one, 61),
        (1, &three, 62),
        (1, &first, 63),
        (0, &first, 64),
    ] {
        c.draws.push(Draw::masked(
            row,
            with_top(SamplingParams::default(), 4096),
            0,
            bits,
        ));
        c.draws
            .push(Draw::masked(row, with_top(sampled(1.0), 16), seed, bits));
    }
    vec![c]
}

/// `min_p` set to exactly one token's weight (the CPU's f32 weight, `sampling::weight`), so
/// that token is the last survivor, with seeds that draw it on the CPU: the device must draw it
/// too. A device weight one unit in the last place lower (another `exp`, a fused
/// multiply-add) drops it and draws another token.
fn weight_boundary_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (k, &vocab) in [5000usize, 128_256].iter().enumerate() {
        let row = cuda_common::random(vocab, 777 + k as u64, 10.0);
        let max = row.iter().fold(f32::MIN, |m, &x| m.max(x));
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let mut c = Case::new(
            format!("min_p at a token's weight, vocab {vocab}"),
            vocab,
            vec![row.clone()],
        );
        for t in [0.6f32, 1.0, 1.7] {
            for rank in [1usize, 9, 60] {
                let token = order[rank];
                let mut p = sampled(t);
                p.min_p = weight::weight(row[token as usize], max, weight::scale(t));
                let draws = |s: u64| {
                    sample_seeded(&mut row.clone(), &p, s, &SequenceContext::default()).token
                };
                let seed = (0..5000u64)
                    .find(|&s| draws(s) == token)
                    .unwrap_or_else(|| panic!("no seed draws token {token} at T = {t}"));
                c.draws.push(Draw::new(0, p.clone(), seed));
                c.draws.push(Draw::new(0, p, seed + 1));
            }
        }
        cases.push(c);
    }
    cases
}

fn weight_boundaries<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &weight_boundary_cases());
}

fn large_vocabulary<D: Device>(b: &CudaBackend<D>) {
    check_all(b, &large_vocabulary_cases());
}

/// A mask still being computed when the step starts (set by another thread), and one whose
/// computation failed (`None`: drawn unconstrained, as on the CPU).
fn pending_and_failed_masks<D: Device>(b: &CudaBackend<D>) {
    let vocab: usize = 2000;
    let words = vocab.div_ceil(32);
    let mut c = Case::new("pending masks", vocab, rows(2, vocab, 950, 5.0));
    for (row, seed) in [(0, 1u64), (1, 2)] {
        let mut d = Draw::new(row, with_top(sampled(1.0), 3), seed);
        d.allowed = Some(TokenMask::pending());
        c.draws.push(d);
    }
    c.draws
        .push(Draw::new(0, with_top(SamplingParams::default(), 3), 0));
    std::thread::scope(|scope| {
        let (pending, failed) = (&c.draws[0], &c.draws[1]);
        scope.spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let bits = mask_of((0..vocab as u32).filter(|t| t % 7 == 1), words);
            if let (Some(p), Some(f)) = (&pending.allowed, &failed.allowed) {
                p.set(Some(bits));
                f.set(None);
            }
        });
        check_case(b, &c);
    });
}

fn oversized_top_n_is_an_error<D: Device>(b: &CudaBackend<D>) {
    let logits = vec![0.0f32; 8];
    let buf = b.upload_f32(&logits).unwrap();
    let p = with_top(SamplingParams::default(), 5000);
    let work = LogitsWork {
        samples: vec![RowSample {
            row: 0,
            params: &p,
            seed: 0,
            ctx: SequenceContext::default(),
            allowed: None,
        }],
        scores: Vec::new(),
    };
    assert!(b.process_logits(buf, 1, 8, &work).is_err());
}

#[test]
fn greedy_and_temperature_match_the_cpu() {
    on_every_device!(greedy_and_temperature);
}

#[test]
fn filters_match_the_cpu() {
    on_every_device!(filters);
}

#[test]
fn penalties_bias_and_bans_match_the_cpu() {
    on_every_device!(processors);
}

#[test]
fn ties_match_the_cpu() {
    on_every_device!(ties);
}

#[test]
fn exact_filter_boundaries_match_the_cpu() {
    on_every_device!(boundaries);
}

#[test]
fn degenerate_rows_match_the_cpu() {
    on_every_device!(degenerate);
}

#[test]
fn top_n_and_prompt_scores_match_the_cpu() {
    on_every_device!(top_n_and_scores);
}

#[test]
fn forked_rows_match_the_cpu() {
    on_every_device!(forks);
}

#[test]
fn masked_draws_match_the_cpu() {
    on_every_device!(masks);
}

#[test]
fn masked_draws_with_penalties_and_bans_match_the_cpu() {
    on_every_device!(masked_processors);
}

#[test]
fn masked_and_unmasked_forks_match_the_cpu() {
    on_every_device!(masked_forks);
}

#[test]
fn pending_and_failed_masks_match_the_cpu() {
    on_every_device!(pending_and_failed_masks);
}

#[test]
fn a_128k_vocabulary_with_ties_tight_masks_and_top_4096_matches_the_cpu() {
    on_every_device!(large_vocabulary);
}

#[test]
fn min_p_at_a_tokens_exact_weight_matches_the_cpu() {
    on_every_device!(weight_boundaries);
}

#[test]
fn top_n_above_the_limit_is_an_error() {
    on_every_device!(oversized_top_n_is_an_error);
}
