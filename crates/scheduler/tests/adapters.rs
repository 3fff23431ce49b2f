//! The engine tier of the LoRA cache: a burst over more adapters than `max_loras` gives every
//! request what it gets alone and evicts; adapters equal their merged weights; pinned
//! adapters stay; pins may not take the last slot; a request waits for its adapter's weights
//! while others run; an unregistered adapter leaves the engine once idle.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use lmi_checkpoint::peft::{LoraLimits, LoraWeights, Target};
use lmi_checkpoint::testing::{PeftSpec, write_merged_model, write_peft_adapter};
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, ModelConfig};
use lmi_scheduler::{
    AdapterRef, AdapterWeights, Event, GenerateRequest, Scheduler, SchedulerConfig,
};
use lmi_text::Tokenizer;

/// A rank-4 adapter on every projection, large enough to change greedy outputs.
fn weights(model: &Path, seed: u64) -> (tempfile::TempDir, LoraWeights) {
    let c = ModelConfig::from_file(&model.join("config.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = PeftSpec {
        targets: Target::ALL.map(Target::module).to_vec(),
        scale: 0.3,
        ..PeftSpec::new(4, seed)
    };
    write_peft_adapter(dir.path(), &c, &spec).unwrap();
    let w = LoraWeights::load(dir.path(), &c, LoraLimits::default()).unwrap();
    (dir, w)
}

fn adapter(id: u64, w: &LoraWeights) -> AdapterRef {
    AdapterRef {
        id,
        name: Arc::from(format!("a{id}").as_str()),
        weights: Arc::new(AdapterWeights::ready(Arc::new(w.clone()))),
    }
}

fn with_adapter(mut r: GenerateRequest, a: Option<&AdapterRef>) -> GenerateRequest {
    r.adapter = a.cloned();
    r
}

fn config(max_batch: usize, max_loras: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_loras,
        ..cfg(max_batch, 4096)
    }
}

#[test]
fn a_burst_over_more_adapters_than_slots_matches_each_request_alone() {
    let dir = tiny_model();
    let ws: Vec<_> = (0..6).map(|i| weights(dir.path(), i)).collect();
    let adapters: Vec<AdapterRef> = ws
        .iter()
        .enumerate()
        .map(|(i, (_, w))| adapter(i as u64 + 1, w))
        .collect();
    let requests = || -> Vec<GenerateRequest> {
        (0..14)
            .map(|i| {
                let a = (i < 12).then(|| &adapters[i % 6]);
                let seed = (i % 3 == 1).then_some(40 + i as u64);
                with_adapter(
                    request(prompt(7 + 5 * (i % 4), i as u32), 6 + i % 5, seed),
                    a,
                )
            })
            .collect()
    };
    let solo: Vec<Output> = requests()
        .into_iter()
        .map(|r| {
            let h = spawn(dir.path(), 64, config(1, 8));
            let out = collect(h.submit(r).unwrap());
            h.shutdown();
            out
        })
        .collect();
    // Different adapters give different outputs (the test would prove nothing otherwise).
    assert_ne!(solo[0].tokens(), solo[1].tokens());
    assert_ne!(solo[0].tokens(), solo[12].tokens());

    let h = spawn(dir.path(), 64, config(8, 2));
    let streams: Vec<_> = requests()
        .into_iter()
        .map(|r| h.submit(r).unwrap())
        .collect();
    let together: Vec<Output> = streams.into_iter().map(collect).collect();
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert!(b.error.is_none(), "request {i}: {:?}", b.error);
        assert_eq!(a.tokens(), b.tokens(), "request {i}");
    }
    let m = h.metrics().snapshot();
    assert!(m.lora_engine_loads >= 6, "{m:?}");
    assert!(m.lora_engine_evictions > 0, "{m:?}");
    assert!(m.lora_engine_resident <= 2, "{m:?}");
    wait_pool_whole(&h, 0);
    h.shutdown();
}

#[test]
fn an_adapter_gives_the_tokens_of_its_merged_weights() {
    let dir = tiny_model();
    let (_a, w) = weights(dir.path(), 9);
    let merged = tempfile::tempdir().unwrap();
    write_merged_model(dir.path(), &w, merged.path()).unwrap();
    let a = adapter(1, &w);
    let run = |model: &Path, a: Option<&AdapterRef>| {
        let h = spawn(model, 32, config(2, 2));
        let out = collect(
            h.submit(with_adapter(request(prompt(20, 3), 12, None), a))
                .unwrap(),
        );
        h.shutdown();
        out.tokens()
    };
    let base = run(dir.path(), None);
    let lora = run(dir.path(), Some(&a));
    assert_ne!(base, lora, "the adapter changes the output");
    assert_eq!(lora, run(merged.path(), None));
}

fn scheduler(model: &Path, max_loras: usize) -> Scheduler {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(model, &opts).unwrap();
    Scheduler::new(
        Box::new(engine),
        Tokenizer::from_dir(model).unwrap(),
        config(8, max_loras),
    )
}

/// Runs the scheduler until every request has finished (or `limit` steps).
fn drive(s: &mut Scheduler, limit: usize) {
    for _ in 0..limit {
        if !s.has_work() {
            return;
        }
        s.step();
    }
    panic!("requests did not finish in {limit} steps");
}

fn submit(s: &mut Scheduler, id: u64, r: GenerateRequest) -> tokio::sync::mpsc::Receiver<Event> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    s.add(id, r, tx).unwrap();
    rx
}

fn finished(mut rx: tokio::sync::mpsc::Receiver<Event>) -> Result<usize, String> {
    let mut n = 0;
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token(_) => n += 1,
            Event::Error(e) => return Err(e),
            _ => {}
        }
    }
    Ok(n)
}

#[test]
fn pinned_adapters_stay_and_pins_may_not_take_the_last_slot() {
    let dir = tiny_model();
    let ws: Vec<_> = (0..5).map(|i| weights(dir.path(), i)).collect();
    let a: Vec<AdapterRef> = ws
        .iter()
        .enumerate()
        .map(|(i, (_, w))| adapter(i as u64 + 1, w))
        .collect();
    let mut s = scheduler(dir.path(), 3);
    s.pin_adapter(&a[0]).unwrap();
    s.pin_adapter(&a[1]).unwrap();
    let e = s.pin_adapter(&a[2]).unwrap_err();
    assert!(e.starts_with("No free lora slots"), "{e}");
    assert!(s.engine().has_adapter(1) && s.engine().has_adapter(2));
    // Requests cycling through the unpinned adapters share the one free slot.
    let rxs: Vec<_> = (0..6)
        .map(|i| {
            submit(
                &mut s,
                i,
                with_adapter(
                    request(prompt(9, i as u32), 4, None),
                    Some(&a[2 + i as usize % 3]),
                ),
            )
        })
        .collect();
    drive(&mut s, 500);
    for rx in rxs {
        assert_eq!(finished(rx), Ok(4));
    }
    assert!(
        s.engine().has_adapter(1) && s.engine().has_adapter(2),
        "pinned adapters were evicted"
    );
    assert!(s.metrics().snapshot().lora_engine_evictions >= 2);
    assert_eq!(s.pool().num_used(), 0);
}

#[test]
fn a_request_waits_for_its_adapter_while_others_run() {
    let dir = tiny_model();
    let (_d, w) = weights(dir.path(), 1);
    let mut s = scheduler(dir.path(), 2);
    let pending = AdapterRef {
        id: 7,
        name: Arc::from("slow"),
        weights: Arc::new(AdapterWeights::pending()),
    };
    let waiting = submit(
        &mut s,
        1,
        with_adapter(request(prompt(8, 1), 3, None), Some(&pending)),
    );
    let base = submit(&mut s, 2, request(prompt(8, 2), 3, None));
    for _ in 0..20 {
        s.step();
    }
    assert_eq!(finished(base), Ok(3), "the base request ran meanwhile");
    assert!(s.has_work(), "the adapter's request is still waiting");
    assert_eq!(s.metrics().snapshot().lora_waiting_requests, 1);
    pending.weights.set(Ok(Arc::new(w)));
    drive(&mut s, 100);
    assert_eq!(finished(waiting), Ok(3));

    // Weights that cannot be read fail the request with the reason.
    let broken = AdapterRef {
        id: 8,
        name: Arc::from("broken"),
        weights: Arc::new(AdapterWeights::pending()),
    };
    broken
        .weights
        .set(Err("adapter_model.safetensors is truncated".into()));
    let rx = submit(
        &mut s,
        3,
        with_adapter(request(prompt(8, 3), 3, None), Some(&broken)),
    );
    drive(&mut s, 10);
    let e = finished(rx).unwrap_err();
    assert!(e.contains("broken") && e.contains("truncated"), "{e}");
    assert_eq!(s.pool().num_used(), 0);
}

#[test]
fn a_retired_adapter_finishes_its_requests_then_leaves_the_engine() {
    let dir = tiny_model();
    let (_d, w) = weights(dir.path(), 2);
    let a = adapter(5, &w);
    let mut s = scheduler(dir.path(), 2);
    let rx = submit(
        &mut s,
        1,
        with_adapter(request(prompt(8, 1), 6, None), Some(&a)),
    );
    for _ in 0..3 {
        s.step();
    }
    assert!(s.engine().has_adapter(5));
    s.retire_adapter(5);
    assert!(s.engine().has_adapter(5), "still in use");
    drive(&mut s, 100);
    assert_eq!(finished(rx), Ok(6));
    s.step();
    assert!(!s.engine().has_adapter(5), "unloaded once idle");
}
