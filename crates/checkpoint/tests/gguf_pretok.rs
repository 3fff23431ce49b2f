//! Every pre-tokenizer row of the GGUF importer against HF: the fixtures in `gguf_pretok/` are
//! GGUFs written by llama.cpp's converter from tokenizers trained under each row's pre-tokenizer
//! (`gguf_pretok/generate.py`), with the HF `tokenizers` ids of a corpus of hard strings. The
//! tokenizer.json the importer builds from each GGUF must give the same ids and decode back to
//! the same text; where llama.cpp's `llama-server` ids were recorded, they are checked as well
//! except on the strings the generator found llama.cpp itself to split differently from HF.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use lmi_checkpoint::gguf::GgufFile;
use lmi_checkpoint::gguf::pretokenizers::{self, TABLE};
use lmi_checkpoint::gguf::tokenizer::build;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_pretok")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn every_row_gives_hf_ids_on_the_hard_corpus() {
    let exp = expected();
    let corpus: Vec<&str> = exp["corpus"]
        .as_array()
        .expect("corpus")
        .iter()
        .map(|s| s.as_str().expect("text"))
        .collect();
    let rows = exp["rows"].as_object().expect("rows");
    let mut covered = HashSet::new();
    let mut failures = Vec::new();
    for (name, row) in rows {
        let pre = row["pre"].as_str().expect("pre");
        let gguf = GgufFile::open(&dir().join(format!("{name}.gguf"))).expect("fixture opens");
        assert_eq!(gguf.get_str("tokenizer.ggml.pre").unwrap(), Some(pre));
        let table_row = pretokenizers::lookup(pre).expect("a fixture's name is in the table");
        covered.insert(table_row.names[0]);
        let hf = build(&gguf, 256).expect("tokenizer builds");
        let tok: tokenizers::Tokenizer = hf
            .tokenizer_json
            .to_string()
            .parse()
            .expect("tokenizer.json loads");
        let skip: HashSet<u64> = row
            .get("llama_cpp_differs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        for (i, text) in corpus.iter().enumerate() {
            let want = ids(&row["hf"][i]);
            let got = tok.encode(*text, true).expect("encodes").get_ids().to_vec();
            if got != want {
                failures.push(format!(
                    "{name}: corpus[{i}] ids differ from HF\n  lmi {got:?}\n  hf  {want:?}"
                ));
                continue;
            }
            let decoded = tok.decode(&got, false).expect("decodes");
            if decoded != row["hf_decoded"][i].as_str().expect("decoded") {
                failures.push(format!("{name}: corpus[{i}] decodes to {decoded:?}"));
            }
            let llama_cpp = &row["llama_cpp"];
            if !llama_cpp.is_null() && !skip.contains(&(i as u64)) && ids(&llama_cpp[i]) != got {
                failures.push(format!("{name}: corpus[{i}] ids differ from llama.cpp"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let missing: Vec<_> = TABLE
        .iter()
        .map(|r| r.names[0])
        .filter(|n| !covered.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "table rows without a fixture: {missing:?}"
    );
}

#[test]
fn a_refused_or_unknown_name_is_one_line_naming_it() {
    let exp = expected();
    // Any fixture will do: only the name changes.
    let (name, _) = exp["rows"]
        .as_object()
        .expect("rows")
        .iter()
        .next()
        .expect("a fixture");
    for pre in ["afmoe", "gemma4", "no-such-pre"] {
        let mut gguf = GgufFile::open(&dir().join(format!("{name}.gguf"))).expect("opens");
        gguf.metadata.insert(
            "tokenizer.ggml.pre".into(),
            lmi_checkpoint::gguf::GgufValue::String(pre.into()),
        );
        let e = build(&gguf, 256).err().expect("refused").to_string();
        assert!(e.contains(&format!("{pre:?}")), "{e}");
        assert!(e.contains("original HF directory"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
