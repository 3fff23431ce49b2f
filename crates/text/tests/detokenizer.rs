mod common;

use common::{Rng, first_added_id, sp_byte, sp_id, write_sentencepiece_tokenizer, write_tokenizer};
use lmi_text::{IncrementalDetokenizer, Tokenizer};

fn tiny() -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    (dir, tok)
}

/// Streams `ids` and returns (deltas, flush).
fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let mut d = IncrementalDetokenizer::new(skip);
    let deltas = ids.iter().map(|&id| d.push(tok, id).unwrap()).collect();
    let tail = d.flush(tok).unwrap();
    (deltas, tail)
}

fn assert_stream_matches_decode(tok: &Tokenizer, ids: &[u32], skip: bool) {
    let (deltas, tail) = stream(tok, ids, skip);
    let streamed: String = deltas.concat() + &tail;
    let whole = tok.decode(ids, skip).unwrap();
    assert_eq!(
        streamed, whole,
        "ids {ids:?} skip {skip} deltas {deltas:?} tail {tail:?}"
    );
    for d in &deltas {
        assert!(
            !d.ends_with('\u{FFFD}') || d.is_empty(),
            "delta {d:?} ends mid-character"
        );
    }
}

/// The property on random id sequences, biased toward multi-byte-character pieces.
fn random_sequences(tok: &Tokenizer, seed: u64, count: usize, max_len: u64) {
    let mut rng = Rng(seed);
    let vocab = tok.vocab_size() as u64;
    let pieces: Vec<u32> = ["你好你", "😀🎉", "é", " the", "hello"]
        .iter()
        .flat_map(|t| tok.encode(t, false).unwrap())
        .collect();
    for _ in 0..count {
        let len = rng.below(max_len + 1);
        let ids: Vec<u32> = (0..len)
            .map(|_| {
                if rng.below(2) == 0 {
                    pieces[rng.below(pieces.len() as u64) as usize]
                } else {
                    rng.below(vocab) as u32
                }
            })
            .collect();
        assert_stream_matches_decode(tok, &ids, true);
        assert_stream_matches_decode(tok, &ids, false);
    }
}

#[test]
fn deltas_equal_decode_on_random_sequences() {
    let (_dir, tok) = tiny();
    random_sequences(&tok, 42, 2000, 40);
}

#[test]
fn deltas_equal_decode_on_encoded_text() {
    let (_dir, tok) = tiny();
    for text in [
        "hello 你好你 😀🎉 café",
        "<|im_start|>assistant\n😀<|im_end|><tool>你好",
        "",
        "é",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_stream_matches_decode(&tok, &ids, true);
        assert_stream_matches_decode(&tok, &ids, false);
        let (deltas, tail) = stream(&tok, &ids, false);
        assert_eq!(deltas.concat() + &tail, text);
    }
}

#[test]
fn split_character_waits_for_its_last_byte() {
    let (_dir, tok) = tiny();
    let ids = tok.encode("😀a", false).unwrap();
    // 😀 is F0 9F 98 80: merged first pair, then two single bytes, then 'a'.
    assert_eq!(ids.len(), 4, "{ids:?}");
    let (deltas, tail) = stream(&tok, &ids, true);
    assert_eq!(deltas, ["", "", "😀", "a"]);
    assert_eq!(tail, "");
}

#[test]
fn flush_emits_an_incomplete_character() {
    let (_dir, tok) = tiny();
    let ids = tok.encode("a你", false).unwrap();
    let mut d = IncrementalDetokenizer::new(true);
    let mut out = String::new();
    for &id in &ids[..ids.len() - 1] {
        out += &d.push(&tok, id).unwrap();
    }
    assert_eq!(out, "a");
    assert_eq!(d.flush(&tok).unwrap(), "\u{FFFD}");
    assert_eq!(d.text_so_far(), "a\u{FFFD}");
    assert_eq!(d.flush(&tok).unwrap(), "", "second flush has nothing left");
}

#[test]
fn special_tokens_skipped_or_kept() {
    let (_dir, tok) = tiny();
    let end = first_added_id() + 1;
    let tool = first_added_id() + 2;
    let a = u32::from(b'a');
    let (deltas, _) = stream(&tok, &[a, end, tool, a], true);
    assert_eq!(
        deltas,
        ["a", "", "<tool>", "a"],
        "<tool> is not special, so it stays"
    );
    let (deltas, _) = stream(&tok, &[a, end, a], false);
    assert_eq!(deltas, ["a", "<|im_end|>", "a"]);
}

#[test]
fn prompt_tail_is_context_not_output() {
    let (_dir, tok) = tiny();
    let prompt = tok
        .encode("<|im_start|>user\nsay hi你<|im_end|>", false)
        .unwrap();
    let generated = tok.encode(" the 😀 end", false).unwrap();
    for skip in [true, false] {
        let mut d = IncrementalDetokenizer::with_prompt_tail(&prompt, &tok, skip);
        let mut out = String::new();
        for &id in &generated {
            out += &d.push(&tok, id).unwrap();
        }
        out += &d.flush(&tok).unwrap();
        assert_eq!(out, " the 😀 end");
        assert_eq!(d.text_so_far(), out);
    }
}

#[test]
fn tokenizer_from_env_dir() {
    let Ok(dir) = std::env::var("LMI_TEST_TOKENIZER_DIR") else {
        eprintln!("skipped: LMI_TEST_TOKENIZER_DIR is not set");
        return;
    };
    let tok = Tokenizer::from_dir(&dir).unwrap();
    // Ids of separately encoded chunks, shuffled together: token boundaries fall inside
    // characters as the tokenizer splits them, and the whole stays valid UTF-8 (which
    // byte-fallback tokenizers need; see sentencepiece_stream_matches_decode).
    let chunks: Vec<Vec<u32>> = [
        "Hello",
        ", world!",
        " 你好",
        "😀🎉",
        " naïve café",
        " — the end.",
        "\n\n",
        " 🇫🇷",
        "<|im_start|>",
        "<|im_end|>",
        "ありがとう",
        " \u{1F9D1}\u{200D}\u{1F52C}",
    ]
    .iter()
    .map(|t| tok.encode(t, false).unwrap())
    .collect();
    let mut rng = Rng(7);
    for _ in 0..500 {
        let ids: Vec<u32> = (0..rng.below(20))
            .flat_map(|_| chunks[rng.below(chunks.len() as u64) as usize].clone())
            .collect();
        assert_stream_matches_decode(&tok, &ids, true);
        assert_stream_matches_decode(&tok, &ids, false);
    }
}

fn sentencepiece() -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    write_sentencepiece_tokenizer(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    (dir, tok)
}

#[test]
fn sentencepiece_stream_matches_decode() {
    let (_dir, tok) = sentencepiece();
    let (hello, world, bang) = (sp_id("▁Hello"), sp_id("▁world"), sp_id("!"));
    assert_eq!(
        tok.decode(&[hello, world, bang], true).unwrap(),
        "Hello world!"
    );
    let (deltas, tail) = stream(&tok, &[1, hello, world, bang, 2], true);
    assert_eq!(deltas, ["", "Hello", " world", "!", ""]);
    assert_eq!(tail, "");
    // 😀 through byte fallback, one byte per token.
    let emoji: Vec<u32> = "😀".bytes().map(sp_byte).collect();
    let ids: Vec<u32> = [hello].into_iter().chain(emoji).chain([world]).collect();
    let (deltas, _) = stream(&tok, &ids, true);
    assert_eq!(deltas, ["Hello", "", "", "", "😀", " world"]);
    // ByteFallback turns a whole run of byte tokens into one U+FFFD per byte when the run is
    // not valid UTF-8, so a byte already shown as text can turn into U+FFFD later: no
    // streaming decoder can match that on arbitrary ids. Byte tokens therefore come here as
    // whole characters, which is what a model trained on valid text emits.
    let mut rng = Rng(9);
    let chars = ["a", "é", "你", "😀", " "];
    for _ in 0..1000 {
        let mut ids = Vec::new();
        for _ in 0..rng.below(30) {
            match rng.below(3) {
                0 => ids.push(rng.below(3) as u32),
                1 => ids.push(259 + rng.below(6) as u32),
                _ => ids.extend(chars[rng.below(5) as usize].bytes().map(sp_byte)),
            }
        }
        assert_stream_matches_decode(&tok, &ids, true);
        assert_stream_matches_decode(&tok, &ids, false);
    }
}

#[test]
fn prompt_tail_keeps_the_leading_space_of_the_first_token() {
    let (_dir, tok) = sentencepiece();
    let (hello, world) = (sp_id("▁Hello"), sp_id("▁world"));
    // Decoded alone, the first token loses its space (the decoder strips it)...
    let mut alone = IncrementalDetokenizer::new(true);
    assert_eq!(alone.push(&tok, world).unwrap(), "world");
    // ...but after the prompt it is the continuation " world".
    let mut d = IncrementalDetokenizer::with_prompt_tail(&[1, hello], &tok, true);
    assert_eq!(d.push(&tok, world).unwrap(), " world");
    assert_eq!(d.push(&tok, sp_id("▁你")).unwrap(), " 你");
    assert_eq!(d.flush(&tok).unwrap(), "");
    assert_eq!(d.text_so_far(), " world 你");
}
