//! LMI's adapter management API on the real server: adapters found at start are registered;
//! register → use (LMI, TGI and OpenAI routes) → delete → 424; bad sources refused; pins
//! refused once they would take the last engine slot; metrics; LoRA off answers 400.

mod common;

use std::path::Path;

use common::*;
use lmi_checkpoint::testing::{PeftSpec, TinySpec, write_peft_adapter, write_tiny_model};
use lmi_engine::ModelConfig;

fn adapter(model: &Path, name: &str, seed: u64) -> String {
    let c = ModelConfig::from_file(&model.join("config.json")).unwrap();
    let dir = model.join("adapters").join(name);
    write_peft_adapter(&dir, &c, &PeftSpec::new(4, seed)).unwrap();
    dir.display().to_string()
}

fn lmi(port: u16, adapter: &str) -> Resp {
    let body = format!(
        r#"{{"inputs": "Hello", "adapters": "{adapter}", "parameters": {{"max_new_tokens": 4}}}}"#
    );
    post(port, "/invocations", &body)
}

#[test]
fn register_use_delete_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    adapter(&model, "startup", 1);
    let a2 = adapter(&model, "a2", 2);
    let a3 = adapter(&model, "a3", 3);
    let outside = tmp.path().join("outside");
    let c = ModelConfig::from_file(&model.join("config.json")).unwrap();
    write_peft_adapter(&outside, &c, &PeftSpec::new(4, 4)).unwrap();

    // The adapters directory enables LoRA and registers `a2`, `a3` and `startup` at start.
    let mut server = start(&model, &["-o", "option.max_loras=2"]);
    wait_ready(&mut server, "tiny");
    let port = server.port;
    let listed = get(port, "/models/tiny/adapters").json();
    let names: Vec<&str> = listed["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a2", "a3", "startup"]);
    assert_eq!(
        delete(port, "/adapters/a2").json()["status"],
        "Adapter a2 unregistered"
    );
    assert_eq!(delete(port, "/models/tiny/adapters/a3").status, 200);

    // Register through the API, with and without the model prefix.
    let r = post(port, &format!("/models/tiny/adapters?name=a2&src={a2}"), "");
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("Adapter a2 registered"))
    );
    let r = get(port, "/adapters/a2").json();
    assert_eq!(
        (
            r["name"].as_str(),
            r["preload"].as_bool(),
            r["pin"].as_bool()
        ),
        (Some("a2"), Some(true), Some(false))
    );
    assert_eq!(
        post(port, &format!("/adapters?name=a2&src={a2}"), "").status,
        409
    );

    // Every route selects it.
    assert_eq!(lmi(port, "a2").status, 200, "{}", lmi(port, "a2").body);
    let tgi = post(
        port,
        "/generate",
        r#"{"inputs": "Hi", "parameters": {"max_new_tokens": 3, "adapter_id": "a2"}}"#,
    );
    assert_eq!(tgi.status, 200, "{}", tgi.body);
    let oai = post(
        port,
        "/v1/completions",
        r#"{"model": "a2", "prompt": "Hi", "max_tokens": 3}"#,
    );
    assert_eq!(oai.status, 200, "{}", oai.body);
    let header = request(
        port,
        "POST",
        "/invocations",
        br#"{"inputs": "Hi", "parameters": {"max_new_tokens": 2}}"#,
        &[("X-Amzn-SageMaker-Adapter-Identifier", "startup")],
    )
    .unwrap();
    assert_eq!(header.status, 200, "{}", header.body);
    let models = get(port, "/v1/models").json();
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "a2")
    );

    // Unknown and deleted adapters.
    let r = lmi(port, "nope");
    assert_eq!(r.status, 424);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("Adapter nope is not registered")
    );
    assert_eq!(
        post(
            port,
            "/generate",
            r#"{"inputs": "Hi", "parameters": {"adapter_id": "nope"}}"#
        )
        .status,
        422
    );
    assert_eq!(delete(port, "/adapters/a2").status, 200);
    assert_eq!(lmi(port, "a2").status, 424);
    assert_eq!(delete(port, "/adapters/a2").status, 404);
    assert_eq!(get(port, "/adapters/a2").status, 404);
    assert_eq!(get(port, "/models/other/adapters").status, 404);

    // Sources outside the allowed directories, bad ranks and missing parameters.
    let r = post(
        port,
        &format!("/adapters?name=o&src={}", outside.display()),
        "",
    );
    assert_eq!(r.status, 400);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("outside the directories"),
        "{}",
        r.body
    );
    assert_eq!(r.json()["code"], 400);
    assert_eq!(post(port, "/adapters?name=x", "").status, 400);
    assert_eq!(
        post(
            port,
            &format!("/adapters?name=x&src={a3}&pin=true&preload=false"),
            ""
        )
        .status,
        400
    );

    // Pins: max_loras 2 leaves room for one pin (one slot stays free for the others).
    let r = post(port, &format!("/adapters?name=a3&src={a3}&pin=true"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(port, "/adapters/a3").json()["pin"], true);
    let r = post(port, "/adapters/startup/update?pin=true", "");
    assert_eq!(r.status, 507, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("No free lora slots")
    );
    assert_eq!(post(port, "/adapters/a3/update?pin=false", "").status, 400);
    assert_eq!(lmi(port, "a3").status, 200);
    assert_eq!(lmi(port, "startup").status, 200);

    let m = get(port, "/metrics").body;
    assert_eq!(metric(&m, "lmi_lora_adapters_registered"), Some(2.0), "{m}");
    assert_eq!(metric(&m, "lmi_lora_adapters_pinned"), Some(1.0), "{m}");
    assert!(
        metric(&m, "lmi_lora_engine_loads_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    assert!(m.contains("lmi_lora_requests_total{adapter=\"a3\"}"), "{m}");
    wait_metric(port, "lmi_kv_cache_blocks_used", 0.0);
    let status = sigterm_and_wait(&mut server);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn lora_off_refuses_management() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let mut server = start(&model, &[]);
    wait_ready(&mut server, "tiny");
    let r = post(server.port, "/adapters?name=a&src=/x", "");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["message"], "LoRA is not enabled.");
    assert_eq!(get(server.port, "/adapters").status, 400);
    assert_eq!(lmi(server.port, "a").status, 424);
}
