//! The real Python clients (huggingface_hub InferenceClient, text-generation 0.7, the openai
//! SDK, the cohere SDK) and raw HTTP checks (tests/clients/*.py, pytest) against `lmi serve` on the default
//! model. .ci/run installs tests/clients/requirements.txt.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut b = String::new();
    let _ = s.read_to_string(&mut b);
    b.starts_with("HTTP/1.1 200")
}

#[test]
fn python_clients_against_the_default_model() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let deps = Command::new("python3")
        .args([
            "-c",
            "import huggingface_hub, text_generation, openai, anthropic, cohere, pytest, requests, schemathesis, selenium, lm_eval, transformers",
        ])
        .status()
        .expect("python3");
    assert!(
        deps.success(),
        "the client tests need `python3 -m pip install -r tests/clients/requirements.txt` (.ci/run does it)"
    );
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_lmi"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--max-model-len",
            "512",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start lmi serve");
    let t = Instant::now();
    while !ready(port) {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "lmi serve not ready in 600 s"
        );
        if let Ok(Some(status)) = server.try_wait() {
            panic!("lmi serve exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = Command::new("python3")
        .args(["-m", "pytest", "-q", "-x", "tests/clients"])
        .current_dir(root)
        .env("LMI_TEST_URL", format!("http://127.0.0.1:{port}"))
        // For tests that start a server of their own (API keys, schemathesis's short context).
        .env("LMI_BIN", env!("CARGO_BIN_EXE_lmi"))
        .status()
        .expect("run pytest");
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let exit = server.wait().expect("wait for lmi serve");
    assert!(
        status.success(),
        "the Python client tests failed (see above)"
    );
    assert_eq!(
        exit.code(),
        Some(0),
        "lmi serve did not exit cleanly on SIGTERM"
    );
}
