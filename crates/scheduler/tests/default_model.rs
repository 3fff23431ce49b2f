//! The default model (SmolLM2-135M-Instruct) through the scheduler: concurrent requests give
//! exactly the tokens each gives alone, greedy and seeded, including when a small pool forces
//! preemption.

mod common;

use common::{Output, collect, wait_pool_whole};
use lmi_engine::DType;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::{GenerateRequest, Handle, SchedulerConfig};
use lmi_text::Tokenizer;

fn requests(tok: &Tokenizer) -> Vec<GenerateRequest> {
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):\n",
        "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
        "Once upon a time",
        "1, 2, 3, 4,",
        "The three primary colors are",
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = GenerateRequest::new(tok.encode(p, false).unwrap());
            r.stopping.max_new_tokens = 32;
            r.stopping.ignore_eos = true;
            if i % 2 == 1 {
                r.sampling.temperature = 0.8;
                r.sampling.top_p = 0.9;
                r.sampling.seed = 1000 + i as u64;
            }
            r
        })
        .collect()
}

fn spawn(dir: &std::path::Path, blocks: usize, max_batch: usize) -> Handle {
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(blocks),
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    let cfg = SchedulerConfig {
        max_batch_size: max_batch,
        max_batch_tokens: 64,
        max_model_len: 2048,
        max_waiting: 100,
        max_loras: 4,
        ..Default::default()
    };
    Handle::spawn(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), cfg)
}

#[test]
fn concurrent_equals_alone_on_the_default_model() {
    let dir = lmi_store::default_model_dir(false).expect("provision the default model");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let solo: Vec<Output> = {
        let h = spawn(&dir, 32, 1);
        requests(&tok)
            .into_iter()
            .map(|r| collect(h.submit(r).unwrap()))
            .collect()
    };
    for blocks in [64, 9] {
        let h = spawn(&dir, blocks, 6);
        let streams: Vec<_> = requests(&tok)
            .into_iter()
            .map(|r| h.submit(r).unwrap())
            .collect();
        let together: Vec<Output> = streams.into_iter().map(collect).collect();
        for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
            assert!(b.error.is_none(), "{:?}", b.error);
            assert_eq!(a.tokens(), b.tokens(), "request {i} with {blocks} blocks");
            assert_eq!(a.seqs[0].text, b.seqs[0].text);
        }
        if blocks == 9 {
            assert!(h.metrics().snapshot().preemptions > 0);
        }
        wait_pool_whole(&h, 0);
    }
}

/// One beam is greedy decoding; a prediction of the output (speculative decoding) changes
/// nothing either, on the real model.
#[test]
fn one_beam_and_drafts_equal_greedy_on_the_default_model() {
    use lmi_scheduler::{BeamParams, EarlyStopping};
    let dir = lmi_store::default_model_dir(false).expect("provision the default model");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let h = spawn(&dir, 64, 4);
    for r in requests(&tok).into_iter().step_by(2) {
        let plain = collect(h.submit(r.clone()).unwrap());
        let mut b = r.clone();
        b.beam = Some(BeamParams {
            width: 1,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            num_return: 1,
        });
        let beamed = collect(h.submit(b).unwrap());
        assert_eq!(plain.tokens(), beamed.tokens());
        let mut d = r.clone();
        d.draft = plain.seqs[0].tokens.clone();
        let drafted = collect(h.submit(d).unwrap());
        assert_eq!(plain.tokens(), drafted.tokens());
        assert_eq!(plain.seqs[0].logprobs, drafted.seqs[0].logprobs);
        let f = drafted.seqs[0].finished.as_ref().unwrap();
        assert!(f.accepted_draft_tokens > 16, "{f:?}");
    }
    wait_pool_whole(&h, 0);
}
