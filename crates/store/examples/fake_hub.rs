//! The stand-in Hub of the tests (tests/support/fake_hub.rs) as a process, for checks that
//! start `lmi` elsewhere (deploy/ci/image.sh runs the CPU image against it, as SageMaker runs
//! it with HF_MODEL_ID): serves each `--repo org/name=PATH` (a directory's files, or one file)
//! until killed, and prints its URL on the first line of stdout.
//!
//! cargo run -p lmi-store --example fake_hub -- --repo test/model-GGUF=model.Q4_1.gguf

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;

use std::io::Write;
use std::path::Path;

use axum::body::Bytes;
use fake_hub::{FakeHub, Repo};

fn files_of(path: &Path) -> Vec<(String, Bytes)> {
    let read =
        |p: &Path| Bytes::from(std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
    if path.is_file() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        return vec![(name, read(path))];
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let p = e.unwrap().path();
        if p.is_file() {
            out.push((
                p.file_name().unwrap().to_string_lossy().into_owned(),
                read(&p),
            ));
        }
    }
    out
}

fn main() {
    let hub = FakeHub::start();
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.windows(2).filter(|w| w[0] == "--repo") {
        let (name, path) = pair[1].split_once('=').expect("--repo org/name=PATH");
        let repo = Repo::from_bytes(files_of(Path::new(path)));
        eprintln!("{name}: commit {}", repo.commit());
        hub.add(name, repo);
    }
    println!("{}", hub.url);
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
