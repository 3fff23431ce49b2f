//! Compiled kernels cached on disk, so a server starts without recompiling.
//!
//! An entry is keyed by everything that shapes the CUBIN: the source and every header, the
//! NVRTC options (which name the architecture) and the NVRTC version. Entries are written to
//! a temporary file and renamed into place, so readers never see half an entry; each carries
//! a SHA-256 of its contents, so a damaged one is recompiled. The cache never makes a
//! compilation fail: an unusable directory only costs the recompilation, with a warning.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::kernels::{KernelSource, source_hash};
use crate::nvrtc::{Arch, Compiled};

/// Overrides the cache directory.
pub const CACHE_ENV: &str = "LMI_KERNEL_CACHE";

const MAGIC: &[u8; 8] = b"LMIKC\x001\n";
const DIGEST_LEN: usize = 32;

/// Identifies one compilation: a source (with its headers) compiled by one NVRTC version
/// with one set of options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    file: String,
    arch: Arch,
    digest: [u8; 32],
}

impl CacheKey {
    pub fn new(
        source: &KernelSource,
        headers: &[KernelSource],
        arch: Arch,
        options: &[String],
        nvrtc_version: (u32, u32),
    ) -> Self {
        let mut h = Sha256::new();
        h.update(source_hash(source, headers));
        h.update(arch.to_string().as_bytes());
        for option in options {
            h.update((option.len() as u64).to_le_bytes());
            h.update(option.as_bytes());
        }
        h.update(nvrtc_version.0.to_le_bytes());
        h.update(nvrtc_version.1.to_le_bytes());
        CacheKey {
            file: source.name.to_string(),
            arch,
            digest: h.finalize().into(),
        }
    }

    /// `embedding.cu.sm_90.<hash>.cubin`: readable, and unique per key.
    fn file_name(&self) -> String {
        let hex: String = self.digest[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{}.{}.{hex}.cubin", self.file, self.arch)
    }
}

/// A directory of compiled kernels, or no cache at all.
#[derive(Debug, Default)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    warned: AtomicBool,
}

impl KernelCache {
    /// `$LMI_KERNEL_CACHE`, else `$XDG_CACHE_HOME/lmi/kernels`, else `~/.cache/lmi/kernels`;
    /// no cache if none of them is set.
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v: &OsString| !v.is_empty());
        Self {
            dir: default_dir(var(CACHE_ENV), var("XDG_CACHE_HOME"), var("HOME")),
            warned: AtomicBool::new(false),
        }
    }

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            warned: AtomicBool::new(false),
        }
    }

    /// Compiles every time.
    pub fn disabled() -> Self {
        Self::default()
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The cached compilation for `key`, or `None` if absent, unreadable or damaged.
    pub fn get(&self, key: &CacheKey) -> Option<Compiled> {
        let path = self.dir.as_ref()?.join(key.file_name());
        let bytes = std::fs::read(&path).ok()?;
        let decoded = decode(&bytes);
        if decoded.is_none() {
            tracing::warn!(path = %path.display(), "damaged kernel cache entry; recompiling");
        }
        decoded
    }

    /// Stores `compiled` under `key`; a failure is a warning (once per cache), never an error.
    pub fn put(&self, key: &CacheKey, compiled: &Compiled) {
        let Some(dir) = &self.dir else { return };
        if let Err(e) = write_atomically(dir, &key.file_name(), &encode(compiled))
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                dir = %dir.display(),
                "cannot write the kernel cache ({e}); kernels will be recompiled at every \
                 start (set {CACHE_ENV} to a writable directory)"
            );
        }
    }

    /// The cached compilation for `key`, else `compile()`'s result, cached.
    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Compiled>,
    ) -> Result<Compiled> {
        if let Some(hit) = self.get(key) {
            return Ok(hit);
        }
        let compiled = compile()?;
        self.put(key, &compiled);
        Ok(compiled)
    }
}

fn default_dir(
    lmi: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    if let Some(dir) = lmi {
        return Some(PathBuf::from(dir));
    }
    // The XDG spec ignores a relative XDG_CACHE_HOME.
    if let Some(xdg) = xdg.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Some(xdg.join("lmi/kernels"));
    }
    home.map(|h| PathBuf::from(h).join(".cache/lmi/kernels"))
}

/// `MAGIC`, SHA-256 of the rest, log length (u32 LE), log, CUBIN.
fn encode(c: &Compiled) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + c.log.len() + c.cubin.len());
    payload.extend_from_slice(&(c.log.len() as u32).to_le_bytes());
    payload.extend_from_slice(c.log.as_bytes());
    payload.extend_from_slice(&c.cubin);
    let mut out = Vec::with_capacity(MAGIC.len() + DIGEST_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

fn decode(bytes: &[u8]) -> Option<Compiled> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let (digest, payload) = rest.split_at_checked(DIGEST_LEN)?;
    if Sha256::digest(payload).as_slice() != digest {
        return None;
    }
    let (len, rest) = payload.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let (log, cubin) = rest.split_at_checked(len)?;
    if cubin.is_empty() {
        return None;
    }
    Some(Compiled {
        cubin: cubin.to_vec(),
        log: String::from_utf8_lossy(log).into_owned(),
        from_cache: true,
    })
}

/// Writes `dir/name` through a temporary file in `dir` and a rename, so concurrent readers
/// and writers (two servers starting at once) see a whole entry or none.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::error::CudaError;

    const SRC: KernelSource = KernelSource {
        name: "k.cu",
        text: "extern \"C\" __global__ void k() {}",
    };
    const HDR: KernelSource = KernelSource {
        name: "common.cuh",
        text: "#pragma once",
    };

    fn key(src: &KernelSource, arch: Arch, version: (u32, u32)) -> CacheKey {
        CacheKey::new(src, &[HDR], arch, &["-std=c++17".into()], version)
    }

    fn compiled(tag: u8) -> Compiled {
        Compiled {
            cubin: vec![0x7f, b'E', b'L', b'F', tag],
            log: format!("log {tag}"),
            from_cache: false,
        }
    }

    /// Counts the compilations `get_or_compile` asks for.
    fn fetch(cache: &KernelCache, key: &CacheKey, tag: u8, calls: &Cell<u32>) -> Compiled {
        cache
            .get_or_compile(key, || {
                calls.set(calls.get() + 1);
                Ok(compiled(tag))
            })
            .expect("compiled")
    }

    #[test]
    fn a_second_lookup_hits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::at(dir.path().join("kernels"));
        let calls = Cell::new(0);
        let k = key(&SRC, Arch::SM90, (13, 5));
        let first = fetch(&cache, &k, 1, &calls);
        assert!(!first.from_cache);
        let second = fetch(&cache, &k, 2, &calls);
        assert_eq!(calls.get(), 1);
        assert!(second.from_cache);
        assert_eq!((second.cubin, second.log), (first.cubin, first.log));
        // Only the entry is left: the temporary file was renamed.
        let files: Vec<_> = std::fs::read_dir(dir.path().join("kernels"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        assert!(files[0].starts_with("k.cu.sm_90."), "{files:?}");
    }

    #[test]
    fn a_change_of_source_header_options_arch_or_version_misses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::at(dir.path());
        let calls = Cell::new(0);
        let base = key(&SRC, Arch::SM90, (13, 5));
        fetch(&cache, &base, 1, &calls);
        let edited = KernelSource {
            text: "extern \"C\" __global__ void k() { }",
            ..SRC
        };
        let other_header = KernelSource {
            text: "#pragma once\n",
            ..HDR
        };
        let others = [
            key(&edited, Arch::SM90, (13, 5)),
            CacheKey::new(
                &SRC,
                &[other_header],
                Arch::SM90,
                &["-std=c++17".into()],
                (13, 5),
            ),
            CacheKey::new(&SRC, &[HDR], Arch::SM90, &["-std=c++20".into()], (13, 5)),
            key(&SRC, Arch::SM80, (13, 5)),
            key(&SRC, Arch::SM90, (13, 6)),
        ];
        for (i, k) in others.iter().enumerate() {
            assert_ne!(k, &base);
            let c = fetch(&cache, k, 10 + i as u8, &calls);
            assert!(!c.from_cache, "key {i} hit");
        }
        assert_eq!(calls.get(), 1 + others.len() as u32);
        assert!(fetch(&cache, &base, 99, &calls).from_cache);
    }

    #[test]
    fn a_damaged_entry_is_recompiled_and_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::at(dir.path());
        let calls = Cell::new(0);
        let k = key(&SRC, Arch::SM90, (13, 5));
        fetch(&cache, &k, 1, &calls);
        let path = dir.path().join(k.file_name());
        let good = std::fs::read(&path).expect("entry");

        let mut flipped = good.clone();
        *flipped.last_mut().expect("non-empty") ^= 1;
        let damaged = [
            flipped,
            good[..good.len() - 1].to_vec(),
            b"garbage".to_vec(),
            Vec::new(),
        ];
        for (i, bytes) in damaged.iter().enumerate() {
            std::fs::write(&path, bytes).expect("write");
            let c = fetch(&cache, &k, 2, &calls);
            assert!(!c.from_cache, "damage {i} was read as an entry");
            assert_eq!(c.cubin, compiled(2).cubin);
            assert!(
                fetch(&cache, &k, 3, &calls).from_cache,
                "damage {i} not replaced"
            );
        }
    }

    #[test]
    fn an_unreadable_entry_is_recompiled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::at(dir.path());
        let k = key(&SRC, Arch::SM90, (13, 5));
        // A directory where the entry should be: reading fails, and so does the rename.
        std::fs::create_dir(dir.path().join(k.file_name())).expect("mkdir");
        let calls = Cell::new(0);
        assert!(!fetch(&cache, &k, 1, &calls).from_cache);
        assert!(!fetch(&cache, &k, 1, &calls).from_cache);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn an_unwritable_directory_is_not_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").expect("write");
        // A directory below a regular file can never be created, even by root.
        let cache = KernelCache::at(file.join("kernels"));
        let calls = Cell::new(0);
        let k = key(&SRC, Arch::SM90, (13, 5));
        assert_eq!(fetch(&cache, &k, 1, &calls).cubin, compiled(1).cubin);
        assert_eq!(fetch(&cache, &k, 1, &calls).cubin, compiled(1).cubin);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn compile_errors_pass_through_and_are_not_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::at(dir.path());
        let k = key(&SRC, Arch::SM90, (13, 5));
        let err = cache.get_or_compile(&k, || {
            Err(CudaError::Compile {
                file: "k.cu".into(),
                arch: "sm_90".into(),
                log: "error".into(),
            })
        });
        assert!(matches!(err, Err(CudaError::Compile { .. })));
        assert!(cache.get(&k).is_none());
    }

    #[test]
    fn a_disabled_cache_always_compiles() {
        let cache = KernelCache::disabled();
        let calls = Cell::new(0);
        let k = key(&SRC, Arch::SM90, (13, 5));
        fetch(&cache, &k, 1, &calls);
        fetch(&cache, &k, 1, &calls);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn the_directory_follows_the_environment() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            default_dir(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            default_dir(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/lmi/kernels"))
        );
        assert_eq!(
            default_dir(None, s("relative"), s("/h")),
            Some(PathBuf::from("/h/.cache/lmi/kernels"))
        );
        assert_eq!(default_dir(None, None, None), None);
    }
}
