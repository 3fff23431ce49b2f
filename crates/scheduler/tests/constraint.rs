//! Grammars compiled against a real vocabulary: walking any path the masks allow yields text
//! the grammar accepts; bad grammars are refused with a reason.

mod common;

use lmi_scheduler::constraint::{GrammarSpec, Guide, SeqConstraint};
use lmi_text::Tokenizer;

fn guide(dir: &std::path::Path) -> Guide {
    let tok = Tokenizer::from_dir(dir).unwrap();
    let eos = tok.eos_token_ids();
    Guide::new(dir, tok, lmi_checkpoint::testing::TINY_VOCAB, &eos).unwrap()
}

fn allowed(mask: &[u32]) -> Vec<u32> {
    (0..mask.len() as u32 * 32)
        .filter(|&t| mask[t as usize / 32] & (1 << (t % 32)) != 0)
        .collect()
}

/// Generates by taking, at each step, the `pick`-th allowed token (cycling), until the
/// grammar completes; returns the text.
fn walk(c: &mut SeqConstraint, tok: &Tokenizer, eos: &[u32], pick: usize) -> String {
    let mut ids = Vec::new();
    for step in 0..200 {
        let mask = c.mask().unwrap();
        let options: Vec<u32> = allowed(&mask)
            .into_iter()
            .filter(|t| !eos.contains(t))
            .collect();
        if options.is_empty() || c.is_finished() {
            break;
        }
        let t = options[(pick + step) % options.len()];
        c.commit(t).unwrap();
        ids.push(t);
        if c.is_finished() {
            break;
        }
    }
    tok.decode(&ids, true).unwrap()
}

#[test]
fn every_path_the_masks_allow_matches_the_grammar() {
    let dir = common::tiny_model();
    let g = guide(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let eos = tok.eos_token_ids();

    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["x", "yz"]}
        },
        "required": ["n", "tag"],
        "additionalProperties": false
    });
    let compiled = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    for pick in 0..5 {
        let text = walk(&mut compiled.start(), &tok, &eos, pick);
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let n = v["n"].as_i64().unwrap_or_else(|| panic!("{text}"));
        assert!((0..=99).contains(&n), "{text}");
        assert!(v["tag"] == "x" || v["tag"] == "yz", "{text}");
    }

    let rx = g
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]{2}".into()))
        .unwrap();
    for pick in 0..5 {
        let text = walk(&mut rx.start(), &tok, &eos, pick);
        assert!(
            text.len() == 6 && text[..3].bytes().all(|b| b.is_ascii_digit()) && &text[3..4] == "-",
            "{text:?}"
        );
    }

    let choice = g
        .compile(&GrammarSpec::Choice(vec![
            "yes".into(),
            "no".into(),
            "a.b".into(),
        ]))
        .unwrap();
    for pick in 0..4 {
        let text = walk(&mut choice.start(), &tok, &eos, pick);
        assert!(["yes", "no", "a.b"].contains(&text.as_str()), "{text:?}");
    }

    // Forked constraints are independent.
    let mut a = rx.start();
    a.commit(tok.encode("1", false).unwrap()[0]).unwrap();
    let mut b = a.fork();
    b.commit(tok.encode("2", false).unwrap()[0]).unwrap();
    let ma = allowed(&a.mask().unwrap());
    assert!(ma.contains(&tok.encode("7", false).unwrap()[0]));
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let dir = common::tiny_model();
    let g = guide(dir.path());
    let e = g
        .compile(&GrammarSpec::Regex("(unclosed".into()))
        .err()
        .unwrap();
    assert!(e.contains("regex"), "{e}");
    let e = g
        .compile(&GrammarSpec::JsonSchema(serde_json::json!({"type": 12})))
        .err()
        .unwrap();
    assert!(!e.is_empty());
    assert!(g.compile(&GrammarSpec::Choice(vec![])).is_err());
    assert!(
        g.compile(&GrammarSpec::Lark("start: nothing_defined".into()))
            .is_err()
    );
}

fn text_of(o: &common::Output, i: usize) -> String {
    o.seqs[i].text.clone()
}

#[test]
fn constrained_requests_through_the_scheduler_parse_alone_together_and_forked() {
    use common::*;
    let dir = tiny_model();
    let g = guide(dir.path());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": false
    });
    let json = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let digits = g.compile(&GrammarSpec::Regex("[0-9]{4}".into())).unwrap();
    let requests = || {
        (0..6)
            .map(|i| {
                let mut r = request(
                    prompt(5 + 3 * i, i as u32),
                    60,
                    (i % 2 == 1).then_some(9 + i as u64),
                );
                r.stopping.ignore_eos = false;
                r.constraint = match i % 3 {
                    0 => Some(json.clone()),
                    1 => Some(digits.clone()),
                    _ => None,
                };
                if i == 3 {
                    r.n = 2;
                    r.best_of = 2;
                    r.sampling.temperature = 1.0;
                }
                r
            })
            .collect::<Vec<_>>()
    };
    let check = |outs: &[Output]| {
        for (i, o) in outs.iter().enumerate() {
            assert!(o.error.is_none(), "request {i}: {:?}", o.error);
            for s in 0..o.seqs.len() {
                let t = text_of(o, s);
                match i % 3 {
                    0 => {
                        let v: serde_json::Value =
                            serde_json::from_str(&t).unwrap_or_else(|e| panic!("{i}: {t:?}: {e}"));
                        // JSON Schema's integers are numbers with no fraction: `-0` is one.
                        let id = v["id"].as_f64().unwrap_or(0.5);
                        assert!(id.fract() == 0.0 && v["ok"].is_boolean(), "{t}");
                    }
                    1 => assert!(
                        t.len() == 4 && t.bytes().all(|b| b.is_ascii_digit()),
                        "{i}: {t:?}"
                    ),
                    _ => {}
                }
            }
        }
    };
    let solo: Vec<Output> = requests()
        .into_iter()
        .map(|r| {
            let h = spawn(dir.path(), 64, cfg(1, 4096));
            let o = collect(h.submit(r).unwrap());
            h.shutdown();
            o
        })
        .collect();
    check(&solo);
    assert_eq!(solo[3].seqs.len(), 2);
    // Together with chunked prefill, then with a pool small enough to preempt.
    for (blocks, budget) in [(64, 16), (10, 4096)] {
        let h = spawn(dir.path(), blocks, cfg(6, budget));
        let streams: Vec<_> = requests()
            .into_iter()
            .map(|r| h.submit(r).unwrap())
            .collect();
        let together: Vec<Output> = streams.into_iter().map(collect).collect();
        check(&together);
        for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
            assert_eq!(a.tokens(), b.tokens(), "request {i} (pool {blocks})");
        }
        wait_pool_whole(&h, 0);
        assert!(h.metrics().snapshot().masks > 0);
        h.shutdown();
    }
}
