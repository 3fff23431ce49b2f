//! The `.cu` and `.cuh` files of the top-level `kernels/` folder, embedded at build time.
//!
//! `build.rs` lists the folder, so every file there is here without being named in code.
//! Each `.cu` compiles on its own; headers reach NVRTC as in-memory sources, so a deployment
//! needs no include folder on disk.

use sha2::{Digest, Sha256};

/// One embedded file: its name in `kernels/` and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    pub name: &'static str,
    pub text: &'static str,
}

// `SOURCES` and `HEADERS`.
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// The `.cu` file named `name`.
pub fn source(name: &str) -> Option<&'static KernelSource> {
    SOURCES.iter().find(|s| s.name == name)
}

/// SHA-256 over a source and every header it may include, each framed by its name and
/// length, so that editing, renaming or adding any header changes the hash.
pub fn source_hash(source: &KernelSource, headers: &[KernelSource]) -> [u8; 32] {
    let mut h = Sha256::new();
    for file in std::iter::once(source).chain(headers) {
        h.update((file.name.len() as u64).to_le_bytes());
        h.update(file.name.as_bytes());
        h.update((file.text.len() as u64).to_le_bytes());
        h.update(file.text.as_bytes());
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_folder_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("kernels folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = SOURCES
            .iter()
            .chain(HEADERS)
            .map(|s| s.name.to_string())
            .collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        let common = HEADERS
            .iter()
            .find(|h| h.name == "common.cuh")
            .expect("common.cuh");
        assert!(common.text.contains("block_sum"));
    }

    #[test]
    fn the_hash_covers_the_source_and_every_header() {
        let src = KernelSource {
            name: "a.cu",
            text: "x",
        };
        let h1 = KernelSource {
            name: "h.cuh",
            text: "1",
        };
        let base = source_hash(&src, &[h1]);
        assert_eq!(base, source_hash(&src, &[h1]));
        let edited = KernelSource { text: "2", ..h1 };
        assert_ne!(base, source_hash(&src, &[edited]));
        let renamed = KernelSource {
            name: "g.cuh",
            ..h1
        };
        assert_ne!(base, source_hash(&src, &[renamed]));
        assert_ne!(
            base,
            source_hash(
                &src,
                &[
                    h1,
                    KernelSource {
                        name: "i.cuh",
                        text: ""
                    }
                ]
            )
        );
        assert_ne!(base, source_hash(&KernelSource { text: "y", ..src }, &[h1]));
        // Framing: moving text across the name/text boundary changes the hash.
        let a = KernelSource {
            name: "ab",
            text: "c",
        };
        let b = KernelSource {
            name: "a",
            text: "bc",
        };
        assert_ne!(source_hash(&a, &[]), source_hash(&b, &[]));
    }
}
