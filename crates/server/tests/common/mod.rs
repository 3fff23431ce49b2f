//! Shared by the end-to-end tests: the built `lmi` binary on a free port, plain HTTP/1.1.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    // The server may answer (413) before reading the whole body and close.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no header end in {raw:?}")))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut rest = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(nl) = rest[i..].windows(2).position(|w| w == b"\r\n") {
            let size_line = String::from_utf8_lossy(&rest[i..i + nl]).to_string();
            let size = usize::from_str_radix(size_line.trim(), 16).unwrap_or(0);
            i += nl + 2;
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[i..i + size]);
            i += size + 2;
        }
        rest = out;
    }
    Ok(Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&rest).to_string(),
    })
}

pub fn get(port: u16, path: &str) -> Resp {
    request(port, "GET", path, b"", &[]).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A port that is free now and that no other server of this test process was given: the
/// OS may hand the same free port to two tests starting servers at once, and then one server
/// fails to bind while its test's polls reach the other's (seen as a reset connection).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

/// Kills the server if a check fails before the orderly SIGTERM.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(model: &Path, extra: &[&str]) -> Server {
    start_with_env(model, extra, &[])
}

/// [`start`] with extra environment variables.
pub fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut args = vec!["--model".into(), model.as_os_str().to_owned()];
    args.extend(extra.iter().map(|a| a.into()));
    serve_with(&args, env)
}

/// `lmi serve` on a free port with exactly `args` after it (no `--model` unless given) and
/// `env` set, the caller's LMI/TGI settings kept out.
pub fn serve_with<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> Server {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmi"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, _) in std::env::vars() {
        if k.starts_with("OPTION_")
            || k.starts_with("SERVING_")
            || k.starts_with("SAGEMAKER_")
            || k.starts_with("HF_")
            || k.starts_with("AWS_")
            || [
                "HF_MODEL_ID",
                "MAX_BATCH_SIZE",
                "MAX_CONCURRENT_REQUESTS",
                "MAX_BATCH_PREFILL_TOKENS",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let child = cmd.spawn().expect("starting lmi serve");
    Server { child, port }
}

/// Polls /ping until 200: before that, every answer must be 503 "PENDING" (or no listener yet).
pub fn wait_ready(server: &mut Server, name: &str) -> Resp {
    wait_ready_within(server, name, Duration::from_secs(120))
}

/// [`wait_ready`] with another deadline.
pub fn wait_ready_within(server: &mut Server, name: &str, limit: Duration) -> Resp {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("lmi serve exited early: {status}");
        }
        match request(server.port, "GET", "/ping", b"", &[]) {
            Ok(r) if r.status == 200 => return r,
            Ok(r) => {
                assert_eq!(r.status, 503, "{}", r.body);
                assert_eq!(r.json()[name]["status"], "PENDING", "{}", r.body);
            }
            // No listener yet, or one that dropped the connection while it started; a crash
            // is caught by `try_wait` on the next turn.
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ),
                "unexpected error: {e}"
            ),
        }
        assert!(Instant::now() < deadline, "not ready after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sigterm_and_wait(server: &mut Server) -> std::process::ExitStatus {
    let ok = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn post(port: u16, path: &str, body: &str) -> Resp {
    request(port, "POST", path, body.as_bytes(), &[]).unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

pub fn delete(port: u16, path: &str) -> Resp {
    request(port, "DELETE", path, b"", &[]).unwrap_or_else(|e| panic!("DELETE {path}: {e}"))
}

/// Polls `/metrics` until `name` reads `value` (gauges the scheduler updates after the step
/// that answered the request), for up to 10 s.
pub fn wait_metric(port: u16, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(port, "/metrics").body;
        if metric(&m, name) == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {value}:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
