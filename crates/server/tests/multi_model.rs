//! Several models in one server (the built `lmi` binary on loopback): tiny Llama, Qwen2 and
//! Qwen3 models served together answer as each does served alone, on every route that names
//! a model; DJL Serving's management API and SageMaker's multi-model contract with the
//! request shapes their documentation gives and each error code; loading on demand from
//! option.models_dir with a memory budget that fits two of three models.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use lmi_checkpoint::testing::{PeftSpec, TinySpec, write_peft_adapter, write_tiny_model};
use serde_json::{Value, json};

const KV: &str = "4M";

/// The three tiny models, each in `TMP/<name>`.
fn models(tmp: &Path) -> Vec<(String, PathBuf)> {
    [
        ("llama", TinySpec::llama()),
        ("qwen2", TinySpec::qwen2()),
        ("qwen3", TinySpec::qwen3()),
    ]
    .into_iter()
    .map(|(n, spec)| {
        let dir = tmp.join(n);
        write_tiny_model(&dir, &spec).unwrap();
        (n.to_string(), dir)
    })
    .collect()
}

/// `lmi serve` with exactly these arguments (no `--model` unless given).
fn serve(args: &[String], env: &[(&str, &str)]) -> Server {
    let mut all = vec!["--kv-cache-bytes".to_string(), KV.to_string()];
    all.extend_from_slice(args);
    serve_with(&all, env)
}

/// A model directory at `dir` with `from`'s config and tokenizer but weights that are not
/// safetensors.
fn write_broken_model(dir: &Path, from: &Path) {
    std::fs::create_dir(dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("model.safetensors"), b"not safetensors").unwrap();
}

/// A local directory as a `url` query value.
fn url(d: &Path) -> String {
    d.display().to_string().replace('/', "%2F")
}

/// DJL's registration (its query form) of `dir` as `name`.
fn register(port: u16, dir: &Path, name: &str) -> Resp {
    let path = format!("/models?url={}&model_name={name}", url(dir));
    request(port, "POST", &path, b"", &[]).unwrap()
}

/// DJL's registration of `dir` as `name` fails with a 400 whose message names the model.
fn registration_fails(port: u16, dir: &Path, name: &str) {
    let r = register(port, dir, name);
    assert_eq!(r.status, 400, "{}", r.body);
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains(name), "{}", r.body);
}

/// Polls `/ping` until 200.
fn wait_ping(server: &mut Server) -> Resp {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("lmi serve exited early: {status}");
        }
        if let Ok(r) = request(server.port, "GET", "/ping", b"", &[])
            && r.status == 200
        {
            return r;
        }
        assert!(Instant::now() < deadline, "not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn post_json(port: u16, path: &str, body: &Value, headers: &[(&str, &str)]) -> Resp {
    request(port, "POST", path, body.to_string().as_bytes(), headers)
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

fn lmi_body() -> Value {
    json!({"inputs": "Hello there", "parameters": {"max_new_tokens": 8, "do_sample": false}})
}

/// The JSON at `pointer` (a reply part that may be empty on a tiny random model).
fn json_at(r: &Resp, pointer: &str) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .pointer(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {}", r.body))
        .to_string()
}

fn text_of(r: &Resp, pointer: &str) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {pointer} in {}", r.body))
        .to_string()
}

/// What each model answers on each route (the name in the path or the body is `name`).
#[derive(Debug, PartialEq, Clone)]
struct Answers {
    predictions: String,
    completions: String,
    chat: String,
    messages: String,
}

fn answers(port: u16, name: &str) -> Answers {
    let predictions = text_of(
        &post_json(port, &format!("/predictions/{name}"), &lmi_body(), &[]),
        "/generated_text",
    );
    let completions = text_of(
        &post_json(
            port,
            "/v1/completions",
            &json!({"model": name, "prompt": "Hello there", "max_tokens": 8, "temperature": 0}),
            &[],
        ),
        "/choices/0/text",
    );
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let chat = json_at(
        &post_json(
            port,
            "/v1/chat/completions",
            &json!({"model": name, "messages": msgs, "max_tokens": 8, "temperature": 0}),
            &[],
        ),
        "/choices/0/message",
    );
    let messages = json_at(
        &post_json(
            port,
            "/v1/messages",
            &json!({"model": name, "messages": msgs, "max_tokens": 8, "temperature": 0}),
            &[],
        ),
        "/content",
    );
    Answers {
        predictions,
        completions,
        chat,
        messages,
    }
}

fn model_args(models: &[(String, PathBuf)]) -> Vec<String> {
    models
        .iter()
        .flat_map(|(n, d)| ["--model".to_string(), format!("{n}={}", d.display())])
        .collect()
}

#[test]
fn three_models_answer_as_each_alone_on_every_route() {
    let tmp = tempfile::tempdir().unwrap();
    let models = models(tmp.path());
    let mut alone: Vec<Server> = models
        .iter()
        .map(|m| serve(&model_args(std::slice::from_ref(m)), &[]))
        .collect();
    let mut multi = serve(&model_args(&models), &[]);
    let ping = wait_ping(&mut multi).json();
    for (n, _) in &models {
        assert_eq!(ping[n]["status"], "Healthy", "{ping}");
    }
    let port = multi.port;
    let mut want = BTreeMap::new();
    for ((name, _), server) in models.iter().zip(alone.iter_mut()) {
        let ping = wait_ping(server);
        assert_eq!(ping.json()[name]["status"], "Healthy", "{}", ping.body);
        want.insert(name.clone(), answers(server.port, name));
    }
    // The three differ (different weights), so routing to the wrong one shows.
    assert_ne!(want["llama"], want["qwen2"]);
    assert_ne!(want["qwen2"], want["qwen3"]);
    for (name, _) in &models {
        assert_eq!(answers(port, name), want[name], "{name}");
        // SageMaker's header on /invocations, with the artifact's name.
        let r = post_json(
            port,
            "/invocations",
            &lmi_body(),
            &[("X-Amzn-SageMaker-Target-Model", &format!("{name}.tar.gz"))],
        );
        assert_eq!(text_of(&r, "/generated_text"), want[name].predictions);
        // The body's `model` on /invocations (its completions shape).
        let r = post_json(
            port,
            "/invocations",
            &json!({"model": name, "prompt": "Hello there", "max_tokens": 8, "temperature": 0}),
            &[],
        );
        assert_eq!(text_of(&r, "/choices/0/text"), want[name].completions);
    }
    // Whole replies keep their Content-Length through the registry, as a single model's.
    let r = post_json(port, "/predictions/qwen2", &lmi_body(), &[]);
    assert_eq!(
        r.header("content-length").map(str::to_string),
        Some(r.body.len().to_string())
    );
    // No name: the first model (TGI's routes, LMI bodies without `model`).
    let tgi = json!({"inputs": "Hello there", "parameters": {"max_new_tokens": 8}});
    let r = post_json(port, "/generate", &tgi, &[]);
    let alone_tgi = post_json(alone[0].port, "/generate", &tgi, &[]);
    assert_eq!(
        text_of(&r, "/generated_text"),
        text_of(&alone_tgi, "/generated_text")
    );
    let r = post_json(port, "/invocations", &lmi_body(), &[]);
    assert_eq!(text_of(&r, "/generated_text"), want["llama"].predictions);

    // Concurrent load on all three at once.
    let threads: Vec<_> = (0..9)
        .map(|i| {
            let name = models[i % 3].0.clone();
            std::thread::spawn(move || {
                let r = post_json(port, &format!("/predictions/{name}"), &lmi_body(), &[]);
                (name, text_of(&r, "/generated_text"))
            })
        })
        .collect();
    for t in threads {
        let (name, text) = t.join().unwrap();
        assert_eq!(text, want[&name].predictions, "{name}");
    }

    // An unknown name: 404 in each schema's own shape, naming the models there are.
    let r = post_json(port, "/predictions/nope", &lmi_body(), &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["type"], "ModelNotFoundException", "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("llama, qwen2, qwen3"),
        "{}",
        r.body
    );
    let r = post_json(
        port,
        "/v1/completions",
        &json!({"model": "nope", "prompt": "x"}),
        &[],
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error_type"], "not_found", "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("qwen3"),
        "{}",
        r.body
    );
    let r = post_json(
        port,
        "/v1/messages",
        &json!({"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}),
        &[],
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["type"], "error", "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "not_found_error", "{}", r.body);
    let r = post_json(
        port,
        "/v1/responses",
        &json!({"model": "nope", "input": "x"}),
        &[],
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "not_found_error", "{}", r.body);

    // A stored response is read back from the model that made it (not the default).
    let r = post_json(
        port,
        "/v1/responses",
        &json!({"model": "qwen3", "input": "Hi", "max_output_tokens": 8, "store": true}),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let back = get(port, &format!("/v1/responses/{id}"));
    assert_eq!(back.status, 200, "{}", back.body);
    assert_eq!(back.json()["model"], "qwen3");

    // Every model listed; per-model metrics carry a `model` label.
    let list = get(port, "/v1/models").json();
    assert_eq!(
        field_of_each(&list, "data", "id"),
        ["llama", "qwen2", "qwen3"]
    );
    let m = get(port, "/metrics").body;
    for (name, _) in &models {
        let series = format!("lmi_kv_cache_blocks_total{{model=\"{name}\"}}");
        assert!(m.contains(&series), "{series} missing:\n{m}");
    }
    assert_eq!(m.matches("# TYPE lmi_kv_cache_blocks_total ").count(), 1);

    assert_eq!(sigterm_and_wait(&mut multi).code(), Some(0));
}

/// A streaming response read up to its first token event; the rest is still to come.
struct Stream {
    s: TcpStream,
    seen: Vec<u8>,
}

/// Reads a streaming response until its first token, then hands back the open stream.
fn start_stream(port: u16, path: &str, body: &Value) -> Stream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("\"token\"") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    Stream { s, seen }
}

/// Reads the stream to its end: how many tokens it carried in all.
fn finish_stream(mut st: Stream) -> usize {
    st.s.read_to_end(&mut st.seen).unwrap();
    String::from_utf8_lossy(&st.seen)
        .matches("\"token\"")
        .count()
}

fn long_stream() -> Value {
    json!({"inputs": "Hello there", "stream": true,
           "parameters": {"max_new_tokens": 200, "do_sample": false, "ignore_eos": true}})
}

#[test]
fn djl_management_api_registers_lists_describes_and_unregisters() {
    let tmp = tempfile::tempdir().unwrap();
    let models = models(tmp.path());
    let mut server = serve(&model_args(&models[..1]), &[]);
    wait_ping(&mut server);
    let port = server.port;

    // Register qwen2 (synchronous, DJL's query form) while llama streams.
    let stream = start_stream(port, "/predictions/llama", &long_stream());
    let r = register(port, &models[1].1, "qwen2");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"status": "Model \"qwen2\" registered."}));
    assert_eq!(finish_stream(stream), 200);
    let r = post_json(port, "/predictions/qwen2", &lmi_body(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);

    // The same name again: 409.
    let r = register(port, &models[1].1, "qwen2");
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.json()["code"], 409);

    // Missing files and a broken model: a clear 400, the others still served.
    let missing = tmp.path().join("missing");
    registration_fails(port, &missing, "gone");
    let broken = tmp.path().join("broken");
    write_broken_model(&broken, &models[0].1);
    registration_fails(port, &broken, "broken");
    let r = post_json(port, "/predictions/llama", &lmi_body(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);

    // Asynchronous: 202, then READY.
    let r = request(
        port,
        "POST",
        &format!(
            "/models?url={}&model_name=qwen3&synchronous=false",
            url(&models[2].1)
        ),
        b"",
        &[],
    )
    .unwrap();
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"status": "Model \"qwen3\" registration scheduled."})
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = get(port, "/models/qwen3").json();
        if d[0]["models"][0]["status"] == "Healthy" {
            break;
        }
        assert!(Instant::now() < deadline, "{d}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // List, with pages.
    let all = get(port, "/models").json();
    assert_eq!(
        field_of_each(&all, "models", "modelName"),
        ["llama", "qwen2", "qwen3"]
    );
    assert_eq!(all["models"][1]["status"], "READY");
    assert!(all.get("nextPageToken").is_none(), "{all}");
    let page = get(port, "/models?limit=2&next_page_token=0").json();
    assert_eq!(page["models"].as_array().unwrap().len(), 2);
    let token = page["nextPageToken"].as_str().unwrap().to_string();
    let page = get(port, &format!("/models?limit=2&next_page_token={token}")).json();
    assert_eq!(page["models"][0]["modelName"], "qwen3");
    assert!(page.get("nextPageToken").is_none(), "{page}");
    assert_eq!(get(port, "/models?limit=0").status, 400);

    // Describe.
    let d = get(port, "/models/qwen2").json();
    assert_eq!(d[0]["workflowName"], "qwen2");
    let m = &d[0]["models"][0];
    assert_eq!(m["modelName"], "qwen2");
    assert_eq!(m["status"], "Healthy");
    assert_eq!(m["workerGroups"][0]["workers"][0]["status"], "READY");
    assert!(m["memoryBytes"].as_u64().unwrap() >= 4 << 20, "{m}");
    let r = get(port, "/models/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["type"], "ModelNotFoundException");

    // Unregister qwen2 while llama is busy; drain qwen3's stream before unloading it.
    let busy = start_stream(port, "/predictions/llama", &long_stream());
    let r = delete(port, "/models/qwen2");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"status": "Model \"qwen2\" unregistered"}));
    let qwen3_stream = start_stream(port, "/predictions/qwen3", &long_stream());
    let deleter = std::thread::spawn(move || delete(port, "/models/qwen3"));
    assert_eq!(
        finish_stream(qwen3_stream),
        200,
        "the drained stream was cut"
    );
    assert_eq!(deleter.join().unwrap().status, 200);
    assert_eq!(finish_stream(busy), 200);
    assert_eq!(delete(port, "/models/qwen2").status, 404);
    let r = post_json(port, "/predictions/qwen2", &lmi_body(), &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    let r = post_json(port, "/predictions/llama", &lmi_body(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

/// A model's footprint as the server counts it: its weights plus the KV cache.
fn footprint(dir: &Path) -> u64 {
    let weights: u64 = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    weights + (4 << 20)
}

#[test]
fn sagemaker_multi_model_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let models = models(tmp.path());
    // Room for one model, not two.
    let budget = footprint(&models[0].1) * 3 / 2;
    let budget = budget.to_string();
    let env = [
        ("SAGEMAKER_MULTI_MODEL", "true"),
        ("OPTION_MODELS_MEMORY", budget.as_str()),
    ];
    let mut server = serve(&[], &env);
    // No model at start: healthy, empty.
    assert_eq!(wait_ping(&mut server).body, "{}");
    let port = server.port;
    assert_eq!(get(port, "/models").json(), json!({"models": []}));
    let load = |name: &str, dir: &Path| {
        post_json(
            port,
            "/models",
            &json!({"model_name": name, "url": dir.display().to_string()}),
            &[],
        )
    };
    assert_eq!(load("a", &models[0].1).status, 200);
    let r = load("a", &models[0].1);
    assert_eq!(r.status, 409, "{}", r.body);
    let r = load("b", &models[1].1);
    assert_eq!(r.status, 507, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("does not fit"),
        "{}",
        r.body
    );

    let d = get(port, "/models/a").json();
    assert_eq!(
        d,
        json!({"modelName": "a", "modelUrl": models[0].1.display().to_string()})
    );
    assert_eq!(get(port, "/models/b").status, 404);
    let list = get(port, "/models").json();
    assert_eq!(list["models"][0]["modelName"], "a");
    assert_eq!(list["models"].as_array().unwrap().len(), 1);

    let r = post_json(
        port,
        "/models/a/invoke",
        &lmi_body(),
        &[("X-Amzn-SageMaker-Target-Model", "a.tar.gz")],
    );
    let via_invoke = text_of(&r, "/generated_text");
    let r = post_json(port, "/predictions/a", &lmi_body(), &[]);
    assert_eq!(text_of(&r, "/generated_text"), via_invoke);
    let r = post_json(port, "/models/b/invoke", &lmi_body(), &[]);
    assert_eq!(r.status, 404, "{}", r.body);

    assert_eq!(delete(port, "/models/a").status, 200);
    assert_eq!(delete(port, "/models/a").status, 404);
    // Its room is back: b fits now.
    let r = load("b", &models[1].1);
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post_json(port, "/models/b/invoke", &lmi_body(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

/// `field` of every entry of the array `list[array]`, in order.
fn field_of_each(list: &Value, array: &str, field: &str) -> Vec<String> {
    list[array]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[field].as_str().unwrap().to_string())
        .collect()
}

fn status_of(port: u16, name: &str) -> String {
    let all = get(port, "/models").json();
    all["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["modelName"] == name)
        .map(|m| m["status"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn on_demand_loads_evict_the_least_recently_used_idle_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("models");
    std::fs::create_dir(&dir).unwrap();
    let models = models(&dir);
    // Room for two of the three.
    let budget = (footprint(&models[0].1) * 5 / 2).to_string();
    let args: Vec<String> = [
        "-o".to_string(),
        format!("option.models_dir={}", dir.display()),
        "-o".to_string(),
        format!("option.models_memory={budget}"),
    ]
    .to_vec();
    let mut server = serve(&args, &[]);
    wait_ping(&mut server);
    let port = server.port;
    let listed = get(port, "/v1/models").json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 3, "{listed}");
    assert_eq!(listed["data"][2]["status"], "UNLOADED");

    let ask = |name: &str| {
        let r = post_json(port, &format!("/predictions/{name}"), &lmi_body(), &[]);
        text_of(&r, "/generated_text")
    };
    // No name: the first model of the directory, loaded on demand.
    let r = post_json(port, "/generate", &json!({"inputs": "Hello there"}), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let first_llama = ask("llama");
    ask("qwen3");
    assert_eq!(status_of(port, "llama"), "READY");
    assert_eq!(status_of(port, "qwen2"), "UNLOADED");
    // qwen2 needs room: llama is the least recently used.
    ask("qwen2");
    assert_eq!(status_of(port, "llama"), "UNLOADED");
    assert_eq!(status_of(port, "qwen3"), "READY");
    // A model with a request in flight is not evicted: qwen3 streams (and was used after
    // qwen2 either way), so llama's load takes qwen2's room.
    let stream = start_stream(port, "/predictions/qwen3", &long_stream());
    assert_eq!(ask("llama"), first_llama);
    assert_eq!(finish_stream(stream), 200);
    assert_eq!(status_of(port, "qwen3"), "READY");
    assert_eq!(status_of(port, "qwen2"), "UNLOADED");
    let m = get(port, "/metrics").body;
    assert!(!m.contains("model=\"qwen2\""), "{m}");
    // A model put in the directory after the start is found by its name.
    let late = dir.join("late");
    std::fs::create_dir(&late).unwrap();
    for f in std::fs::read_dir(&models[1].1).unwrap().flatten() {
        std::fs::copy(f.path(), late.join(f.file_name())).unwrap();
    }
    assert_eq!(ask("late"), ask("qwen2"));
    // /info is the default model's (llama, loaded for it: late, the least recently used,
    // makes room), with every model's status.
    let info = get(port, "/info").json();
    assert_eq!(info["models"]["llama"], "READY", "{info}");
    assert_eq!(info["models"]["qwen2"], "READY", "{info}");
    assert_eq!(info["models"]["late"], "UNLOADED", "{info}");
    assert_eq!(info["models"]["qwen3"], "UNLOADED", "{info}");
    // A broken model in the directory: its requests get a 500 that says why, every time (a
    // new request tries again), and the others keep serving.
    let broken = dir.join("broken");
    write_broken_model(&broken, &models[0].1);
    for _ in 0..2 {
        let r = post_json(port, "/predictions/broken", &lmi_body(), &[]);
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(
            r.json()["message"].as_str().unwrap().contains("broken"),
            "{}",
            r.body
        );
    }
    assert_eq!(status_of(port, "broken"), "FAILED");
    assert_eq!(ask("llama"), first_llama);
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

/// An on-demand load that finds no room (the only loaded model busy, option.evict_wait=0)
/// answers 507, and the model says why (NO_ROOM, not FAILED: nothing is wrong with it);
/// once the busy model is idle, the next request loads it.
#[test]
fn a_model_without_room_says_so_and_loads_when_there_is() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("models");
    std::fs::create_dir(&dir).unwrap();
    models(&dir);
    let args: Vec<String> = [
        "-o".to_string(),
        format!("option.models_dir={}", dir.display()),
        "-o".to_string(),
        "option.max_loaded_models=1".to_string(),
        "-o".to_string(),
        "option.evict_wait=0".to_string(),
    ]
    .to_vec();
    let mut server = serve(&args, &[]);
    wait_ping(&mut server);
    let port = server.port;
    let stream = start_stream(port, "/predictions/llama", &long_stream());
    let r = post_json(port, "/predictions/qwen2", &lmi_body(), &[]);
    assert_eq!(r.status, 507, "{}", r.body);
    assert_eq!(status_of(port, "qwen2"), "NO_ROOM");
    let d = get(port, "/models/qwen2").json();
    let m = &d[0]["models"][0];
    assert_eq!(m["status"], "Unloaded", "{d}");
    assert!(m["error"].as_str().unwrap().contains("does not fit"), "{d}");
    assert_eq!(get(port, "/ping").json()["qwen2"]["status"], "NoRoom");
    assert!(finish_stream(stream) > 1);
    // llama is idle now: qwen2's next request evicts it and loads.
    let r = post_json(port, "/predictions/qwen2", &lmi_body(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(status_of(port, "qwen2"), "READY");
    assert_eq!(status_of(port, "llama"), "UNLOADED");
    assert!(get(port, "/models/qwen2").json()[0]["models"][0]["error"].is_null());
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

#[test]
fn adapters_belong_to_their_model() {
    let tmp = tempfile::tempdir().unwrap();
    let models = models(tmp.path());
    let q2 = &models[1].1;
    let c = lmi_engine::ModelConfig::from_file(&q2.join("config.json")).unwrap();
    // Large enough to change the tiny model's greedy tokens.
    let spec = PeftSpec {
        scale: 2.0,
        ..PeftSpec::new(4, 7)
    };
    write_peft_adapter(&q2.join("adapters").join("ad"), &c, &spec).unwrap();
    let mut server = serve(&model_args(&models[..2]), &[]);
    wait_ping(&mut server);
    let port = server.port;
    // Found in qwen2's directory: qwen2's adapter, not llama's (which has LoRA off).
    let r = get(port, "/models/qwen2/adapters");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"ad\""), "{}", r.body);
    assert_ne!(get(port, "/models/llama/adapters").status, 200);
    // The management API's `/models/{name}` beside the adapter routes under it.
    assert_eq!(
        get(port, "/models/qwen2").json()[0]["models"][0]["adapters"],
        json!(["ad"])
    );
    let listed = get(port, "/v1/models").json();
    let ad = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "ad")
        .cloned()
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(ad["parent"], "qwen2");
    // `model` naming the adapter: qwen2 with the adapter, as `adapter_id` would.
    let with_id = post_json(
        port,
        "/v1/completions",
        &json!({"model": "qwen2", "adapter_id": "ad", "prompt": "Hello there", "max_tokens": 8, "temperature": 0}),
        &[],
    );
    let by_name = post_json(
        port,
        "/v1/completions",
        &json!({"model": "ad", "prompt": "Hello there", "max_tokens": 8, "temperature": 0}),
        &[],
    );
    let base = post_json(
        port,
        "/v1/completions",
        &json!({"model": "qwen2", "prompt": "Hello there", "max_tokens": 8, "temperature": 0}),
        &[],
    );
    let with_id = text_of(&with_id, "/choices/0/text");
    assert_eq!(text_of(&by_name, "/choices/0/text"), with_id);
    assert_ne!(
        text_of(&base, "/choices/0/text"),
        with_id,
        "the adapter changes nothing"
    );
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

/// Load on two models while one is unloaded and registered again: every request either
/// answers or (only for the model while it is gone) gets its 404; the KV caches end empty.
#[test]
fn one_model_reloaded_while_two_are_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let models = models(tmp.path());
    let mut server = serve(&model_args(&models[..2]), &[]);
    wait_ping(&mut server);
    let port = server.port;
    let want: Vec<String> = ["llama", "qwen2"]
        .iter()
        .map(|n| {
            text_of(
                &post_json(port, &format!("/predictions/{n}"), &lmi_body(), &[]),
                "/generated_text",
            )
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let name = ["llama", "qwen2"][i % 2];
            let want = want[i % 2].clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut ok, mut gone) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let r = post_json(port, &format!("/predictions/{name}"), &lmi_body(), &[]);
                    match r.status {
                        200 => {
                            assert_eq!(text_of(&r, "/generated_text"), want, "{name}");
                            ok += 1;
                        }
                        404 if name == "qwen2" => gone += 1,
                        _ => panic!("{name}: {} {}", r.status, r.body),
                    }
                }
                (name, ok, gone)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(delete(port, "/models/qwen2").status, 200);
    let url = url(&models[1].1);
    let r = request(
        port,
        "POST",
        &format!("/models?url={url}&model_name=qwen2"),
        b"",
        &[],
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        let (name, ok, _gone) = w.join().unwrap();
        assert!(ok > 0, "{name} never answered");
    }
    for name in ["llama", "qwen2"] {
        let series = format!("lmi_kv_cache_blocks_used{{model=\"{name}\"}} ");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = get(port, "/metrics").body;
            let v = m.lines().find_map(|l| l.strip_prefix(series.as_str()));
            if v == Some("0") {
                break;
            }
            assert!(Instant::now() < deadline, "{series}never back to 0:\n{m}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}
