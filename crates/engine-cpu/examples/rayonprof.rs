//! What a short parallel loop costs after a stretch of work on the calling thread, on rayon
//! and on the engine's own pool (`pool.rs`):
//! `cargo run --release -p lmi-engine-cpu --example rayonprof -- <work µs> <gap µs>`.

use std::time::Instant;

use rayon::prelude::*;

/// Busy for `us` microseconds (sleeping would let the thread go idle, which is the point).
fn spin(us: f64) {
    let t = Instant::now();
    while t.elapsed().as_secs_f64() * 1e6 < us {}
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (work, gap) = match args[..] {
        [w, g] => (w, g),
        _ => {
            eprintln!("usage: rayonprof <µs of work per loop> <µs alone between loops>");
            std::process::exit(2);
        }
    };
    let threads = lmi_engine_cpu::pool::threads() as f64;
    let rounds = 2000;
    let ideal = gap + work / threads;
    for name in ["rayon", "pool"] {
        let t0 = Instant::now();
        for _ in 0..rounds {
            spin(gap);
            let task = |_| spin(work / 8.0);
            if name == "rayon" {
                (0..8usize).into_par_iter().for_each(task);
            } else {
                lmi_engine_cpu::pool::run(8, task);
            }
        }
        let per = t0.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        println!(
            "{name}: {per:.1} µs a loop (ideal {ideal:.1}, overhead {:.1})",
            per - ideal
        );
    }
}
