//! What a model takes from the memory budget, and what the machine has left.

use std::path::Path;

/// The weights' bytes on disk (a GGUF file, or the checkpoint files of a directory) plus the
/// KV cache: what a model takes from option.models_memory.
pub fn footprint(path: &Path, kv_cache_bytes: usize) -> u64 {
    let weights = if path.is_file() {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    } else {
        std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        let p = e.path();
                        p.extension().is_some_and(|x| {
                            x == "safetensors" || x == "gguf" || x == "bin" || x == "pt"
                        })
                    })
                    .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                    .sum()
            })
            .unwrap_or(0)
    };
    weights + kv_cache_bytes as u64
}

/// MemAvailable from /proc/meminfo (None elsewhere).
pub(super) fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
