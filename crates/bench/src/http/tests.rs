use super::client::metric;
use super::events::{EventKind, EventParser, classify, tokens_in_json};
use super::summary::{percentile, tokens_per_second};
use super::*;

#[test]
fn tokens_per_second_counts_each_token_in_its_window() {
    // 2 s run, 100 ms windows: 3 tokens in the first, 1 in the last.
    let at = [0, 50_000_000, 99_000_000, 1_950_000_000];
    let pts = tokens_per_second(&at, 2.0);
    assert_eq!(pts.len(), 20);
    assert!((pts[0].0 - 0.05).abs() < 1e-9 && (pts[0].1 - 30.0).abs() < 1e-9);
    assert!((pts[19].1 - 10.0).abs() < 1e-9);
    let total: f64 = pts.iter().map(|p| p.1 * 0.1).sum();
    assert!((total - 4.0).abs() < 1e-9);
}

fn events(sse: bool, chunks: &[&[u8]]) -> Vec<String> {
    let mut p = EventParser::new(sse);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut |e| out.push(String::from_utf8(e.to_vec()).unwrap()));
    }
    p.finish(&mut |e| out.push(String::from_utf8(e.to_vec()).unwrap()));
    out
}

#[test]
fn sse_events_split_anywhere() {
    let body = b"data: {\"a\":1}\n\n: comment\n\ndata:{\"b\":2}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
    let want = ["{\"a\":1}", "{\"b\":2}", "l1\nl2", "[DONE]"];
    assert_eq!(events(true, &[body]), want);
    // Every split point, and byte by byte.
    for i in 0..body.len() {
        assert_eq!(
            events(true, &[&body[..i], &body[i..]]),
            want,
            "split at {i}"
        );
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(events(true, &bytes), want);
}

#[test]
fn sse_event_complete_only_at_blank_line() {
    let mut p = EventParser::new(true);
    let mut n = 0;
    p.feed(b"data: {\"token\":1}\n", &mut |_| n += 1);
    assert_eq!(n, 0);
    p.feed(b"\n", &mut |_| n += 1);
    assert_eq!(n, 1);
    // A last event without the blank line is dispatched at the end of the body.
    p.feed(b"data: x", &mut |_| n += 1);
    p.finish(&mut |_| n += 1);
    assert_eq!(n, 2);
}

#[test]
fn jsonlines_events() {
    let body = b"{\"token\":1}\n{\"token\":2}\n\n{\"generated_text\":\"x\"}";
    assert_eq!(
        events(false, &[&body[..5], &body[5..17], &body[17..]]),
        [
            "{\"token\":1}",
            "{\"token\":2}",
            "{\"generated_text\":\"x\"}"
        ]
    );
}

#[test]
fn classify_events() {
    use EventKind::*;
    let tgi = br#"{"index":1,"token":{"id":3,"text":"error","logprob":-1.0,"special":false},"generated_text":null,"details":null}"#;
    assert_eq!(classify(Route::GenerateStream, tgi), Token);
    assert_eq!(
        classify(Route::GenerateStream, br#"{"error":"x","error_type":"y"}"#),
        Error
    );
    assert_eq!(
        classify(
            Route::Invocations,
            br#"{"token":{"id":-1,"error_msg":"x"}}"#
        ),
        Error
    );
    assert_eq!(
        classify(
            Route::Chat,
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ),
        Other
    );
    assert_eq!(
        classify(
            Route::Chat,
            br#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#
        ),
        Token
    );
    assert_eq!(classify(Route::Chat, b"[DONE]"), Other);
    assert_eq!(
        classify(Route::Chat, br#"{"choices":[],"usage":{}}"#),
        Other
    );
}

#[test]
fn percentiles_are_exact_nearest_rank() {
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&v, 50.0), 50);
    assert_eq!(percentile(&v, 90.0), 90);
    assert_eq!(percentile(&v, 99.0), 99);
    assert_eq!(percentile(&v, 100.0), 100);
    assert_eq!(percentile(&v, 0.0), 1);
    assert_eq!(percentile(&[7], 99.0), 7);
    assert_eq!(percentile(&[], 50.0), 0);
    let v = [10, 20, 30, 40];
    assert_eq!(percentile(&v, 50.0), 20);
    assert_eq!(percentile(&v, 51.0), 30);
    assert_eq!(percentile(&v, 99.0), 40);
}

#[test]
fn counts_tokens_and_metrics() {
    assert_eq!(
        tokens_in_json(br#"{"generated_text":"x","details":{"generated_tokens":16}}"#),
        Some(16)
    );
    assert_eq!(
        tokens_in_json(br#"[{"generated_text":"x","details":{"generated_tokens":5}}]"#),
        Some(5)
    );
    assert_eq!(
        tokens_in_json(br#"{"usage":{"completion_tokens":9}}"#),
        Some(9)
    );
    let text = "# HELP x\nlmi_engine_forward_seconds_total 1.5\nlmi_engine_forward_seconds_total_x 9\nfoo{a=\"1\"} 2\nfoo{a=\"2\"} 3\n";
    assert_eq!(metric(text, "lmi_engine_forward_seconds_total"), Some(1.5));
    assert_eq!(metric(text, "foo"), Some(5.0));
    assert_eq!(metric(text, "bar"), None);
    let t = Target::parse("http://127.0.0.1:18181/").unwrap();
    assert_eq!(t.addr, "127.0.0.1:18181");
    assert_eq!(t.path("/generate_stream"), "/generate_stream");
}
