//! Compiling the embedded kernels to CUBIN with NVRTC.
//!
//! The engine at start and the CI check use the same options ([`options`]): no fast-math
//! (kernels call `__expf` and friends where they want speed), ptxas's verbose report in the
//! log, spills reported. They differ in what a spill or a ptxas warning does
//! ([`SpillPolicy`]): in CI it fails the compilation (a performance bug caught before it
//! lands); on a user's machine, whose NVRTC may be an older 13.x than CI's, it is logged and
//! the kernel runs.

use std::ffi::{CString, c_char, c_int};
use std::path::Path;

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};

use crate::cache::{CacheKey, KernelCache};
use crate::error::{CudaError, Result};
use crate::kernels::{self, KernelSource};
use crate::libs::{self, CudaLib, LoadedLib};
use crate::ptxas::{self, FunctionReport};

/// A GPU architecture, `sm_XY` for compute capability X.Y.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    pub const SM90: Arch = Arch { major: 9, minor: 0 };

    pub fn from_compute_capability((major, minor): (u32, u32)) -> Self {
        Arch { major, minor }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// What a register spill or any other ptxas warning does to a compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillPolicy {
    /// Fails it: CI (`crates/cuda/tests/nvrtc_compile.rs`).
    Error,
    /// Lets it through, the warning in the log ([`Compiled::warnings`]): the engine at start.
    Warn,
}

/// The NVRTC options of a compilation for `arch`.
pub fn options(arch: Arch, spills: SpillPolicy) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        // Registers, stack frame, spills and shared memory per function, in the log.
        "-Xptxas=-v".into(),
        "--ptxas-options=--warn-on-spills".into(),
    ];
    if spills == SpillPolicy::Error {
        o.push("--ptxas-options=--warning-as-error".into());
    }
    o
}

/// A compiled kernel file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// NVRTC's full log, with ptxas's report.
    pub log: String,
    /// Read from the disk cache rather than compiled now.
    pub from_cache: bool,
}

impl Compiled {
    /// Registers, stack, spills and shared memory per function.
    pub fn report(&self) -> Vec<FunctionReport> {
        ptxas::parse(&self.log)
    }

    /// The compiler's warnings (spills among them), one line each: empty for a clean build.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self
            .log
            .lines()
            .filter(|l| l.contains("warning"))
            .map(|l| l.trim().to_string())
            .collect();
        w.extend(self.report().iter().filter(|f| f.spills()).map(|f| {
            format!(
                "{}: {} bytes spill stores, {} bytes spill loads",
                f.name, f.spill_store_bytes, f.spill_load_bytes
            )
        }));
        w
    }
}

/// A loaded NVRTC library. Holding one proves the library is loaded, so cudarc's NVRTC
/// functions can be called without a panic.
#[derive(Debug, Clone, Copy)]
pub struct Nvrtc {
    lib: &'static LoadedLib,
    version: (u32, u32),
}

impl Nvrtc {
    /// Finds and loads NVRTC (see [`crate::libs`] for where it looks).
    pub fn load() -> Result<Self> {
        let lib = libs::load(CudaLib::Nvrtc)?;
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: the library is loaded (above); both pointers are valid for writes.
        let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        check(status, "nvrtcVersion")?;
        Ok(Nvrtc {
            lib,
            version: (major.max(0) as u32, minor.max(0) as u32),
        })
    }

    /// (major, minor), e.g. (13, 5).
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// The library file in use.
    pub fn path(&self) -> &Path {
        &self.lib.path
    }

    /// The architectures this NVRTC can compile for.
    pub fn supported_archs(&self) -> Result<Vec<Arch>> {
        let mut n: c_int = 0;
        // SAFETY: the library is loaded; `n` is valid for writes.
        check(
            unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) },
            "nvrtcGetNumSupportedArchs",
        )?;
        let mut numbers = vec![0 as c_int; n.max(0) as usize];
        // SAFETY: `numbers` has room for the `n` values NVRTC writes.
        check(
            unsafe { sys::nvrtcGetSupportedArchs(numbers.as_mut_ptr()) },
            "nvrtcGetSupportedArchs",
        )?;
        // NVRTC numbers them 90 for sm_90, 121 for sm_121.
        Ok(numbers
            .into_iter()
            .map(|n| Arch {
                major: n as u32 / 10,
                minor: n as u32 % 10,
            })
            .collect())
    }

    /// Compiles `source` for `arch` with [`options`] through `cache`: the path the engine
    /// takes at start ([`SpillPolicy::Warn`]) and the CI check takes ([`SpillPolicy::Error`]).
    pub fn compile_cached(
        &self,
        source: &KernelSource,
        headers: &[KernelSource],
        arch: Arch,
        cache: &KernelCache,
        spills: SpillPolicy,
    ) -> Result<Compiled> {
        let options = options(arch, spills);
        let key = CacheKey::new(source, headers, arch, &options, self.version);
        cache.get_or_compile(&key, || self.compile(source, headers, arch, &options))
    }

    /// Compiles every embedded `.cu` file for `arch` (through `cache`, in parallel), in
    /// [`kernels::SOURCES`] order. Fails with the first file's error, by that order.
    pub fn compile_all(
        &self,
        arch: Arch,
        cache: &KernelCache,
        spills: SpillPolicy,
    ) -> Result<Vec<(&'static KernelSource, Compiled)>> {
        let sources = kernels::SOURCES;
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(sources.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut results: Vec<Option<Result<Compiled>>> = (0..sources.len()).map(|_| None).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(source) = sources.get(i) else { break };
                            done.push((
                                i,
                                self.compile_cached(source, kernels::HEADERS, arch, cache, spills),
                            ));
                        }
                        done
                    })
                })
                .collect();
            for h in handles {
                // A worker only panics if NVRTC itself does; pass that on.
                let done = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                for (i, r) in done {
                    results[i] = Some(r);
                }
            }
        });
        sources
            .iter()
            .zip(results)
            .map(|(source, r)| {
                let r = r.ok_or_else(|| {
                    CudaError::Invalid(format!("{} was not compiled", source.name))
                })?;
                Ok((source, r?))
            })
            .collect()
    }

    /// Compiles `source` with `options` (which must name `arch`), bypassing the cache. The
    /// headers are handed to NVRTC as in-memory files, found by `#include "name"`.
    pub fn compile(
        &self,
        source: &KernelSource,
        headers: &[KernelSource],
        arch: Arch,
        options: &[String],
    ) -> Result<Compiled> {
        let fail = |log: String| CudaError::Compile {
            file: source.name.to_string(),
            arch: arch.to_string(),
            log,
        };
        let supported = self.supported_archs()?;
        if !supported.contains(&arch) {
            let list: Vec<String> = supported.iter().map(Arch::to_string).collect();
            return Err(fail(format!(
                "NVRTC {}.{} cannot compile for {arch} (it supports {}): install a newer NVRTC",
                self.version.0,
                self.version.1,
                list.join(", ")
            )));
        }

        let text = c_string(source.text, source.name)?;
        let name = c_string(source.name, source.name)?;
        let header_texts = headers
            .iter()
            .map(|h| c_string(h.text, h.name))
            .collect::<Result<Vec<_>>>()?;
        let header_names = headers
            .iter()
            .map(|h| c_string(h.name, h.name))
            .collect::<Result<Vec<_>>>()?;
        let header_text_ptrs: Vec<*const c_char> =
            header_texts.iter().map(|s| s.as_ptr()).collect();
        let header_name_ptrs: Vec<*const c_char> =
            header_names.iter().map(|s| s.as_ptr()).collect();
        let option_strings = options
            .iter()
            .map(|o| c_string(o, "an NVRTC option"))
            .collect::<Result<Vec<_>>>()?;
        let option_ptrs: Vec<*const c_char> = option_strings.iter().map(|s| s.as_ptr()).collect();

        let program = Program::create(&text, &name, &header_text_ptrs, &header_name_ptrs)?;
        // SAFETY: `program` is live; `option_ptrs` points to `option_strings`, alive here.
        let status = unsafe {
            sys::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
        };
        let log = program.log()?;
        match status {
            nvrtcResult::NVRTC_SUCCESS => {}
            nvrtcResult::NVRTC_ERROR_COMPILATION => return Err(fail(explain_failure(log))),
            other => return Err(fail(format!("nvrtcCompileProgram: {other:?}\n{log}"))),
        }
        let cubin = program.cubin()?;
        Ok(Compiled {
            cubin,
            log,
            from_cache: false,
        })
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtcProgram);

impl Program {
    /// The strings must outlive the program (NVRTC may keep pointers to them).
    fn create(
        text: &CString,
        name: &CString,
        header_texts: &[*const c_char],
        header_names: &[*const c_char],
    ) -> Result<Self> {
        let mut program: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NVRTC is loaded (an `Nvrtc` exists); every pointer is a NUL-terminated
        // string, and both header arrays hold `header_texts.len()` of them.
        let status = unsafe {
            sys::nvrtcCreateProgram(
                &mut program,
                text.as_ptr(),
                name.as_ptr(),
                header_texts.len() as c_int,
                header_texts.as_ptr(),
                header_names.as_ptr(),
            )
        };
        check(status, "nvrtcCreateProgram")?;
        Ok(Program(program))
    }

    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: the program is live; `size` is valid for writes.
        check(
            unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) },
            "nvrtcGetProgramLogSize",
        )?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the `size` bytes (with the NUL) NVRTC writes.
        check(
            unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast()) },
            "nvrtcGetProgramLog",
        )?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: the program is live and compiled; `size` is valid for writes.
        check(
            unsafe { sys::nvrtcGetCUBINSize(self.0, &mut size) },
            "nvrtcGetCUBINSize",
        )?;
        if size == 0 {
            return Err(CudaError::Invalid(
                "NVRTC produced no CUBIN: the architecture option must be a real sm_XY".into(),
            ));
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC writes.
        check(
            unsafe { sys::nvrtcGetCUBIN(self.0, cubin.as_mut_ptr().cast()) },
            "nvrtcGetCUBIN",
        )?;
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

/// ptxas fails a spilling kernel without saying why (its warning, turned into an error, is not
/// in the log): name the culprits.
fn explain_failure(mut log: String) -> String {
    let spilling: Vec<String> = ptxas::parse(&log)
        .into_iter()
        .filter(FunctionReport::spills)
        .map(|f| {
            format!(
                "  {}: {} bytes spill stores, {} bytes spill loads",
                f.name, f.spill_store_bytes, f.spill_load_bytes
            )
        })
        .collect();
    if !spilling.is_empty() {
        log.push_str("register spills are errors (--warn-on-spills --warning-as-error):\n");
        log.push_str(&spilling.join("\n"));
        log.push('\n');
    }
    log
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| CudaError::Invalid(format!("{what} contains a NUL byte")))
}

fn check(status: nvrtcResult, call: &str) -> Result<()> {
    match status {
        nvrtcResult::NVRTC_SUCCESS => Ok(()),
        other => Err(CudaError::Invalid(format!("{call} failed: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(Arch::SM80.to_string(), "sm_80");
        assert_eq!(Arch::from_compute_capability((12, 1)).to_string(), "sm_121");
    }

    #[test]
    fn the_options_name_the_arch_and_make_spills_errors_only_in_ci() {
        let o = options(Arch::SM90, SpillPolicy::Error);
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()));
        assert!(o.iter().any(|o| o.contains("--warn-on-spills")));
        assert!(o.iter().any(|o| o.contains("--warning-as-error")));
        assert!(
            !o.iter()
                .any(|o| o.contains("fast-math") || o.contains("fast_math"))
        );
        let run_time = options(Arch::SM90, SpillPolicy::Warn);
        assert!(run_time.iter().any(|o| o.contains("--warn-on-spills")));
        assert!(!run_time.iter().any(|o| o.contains("--warning-as-error")));
    }

    #[test]
    fn warnings_name_spilling_functions() {
        let c = Compiled {
            cubin: Vec::new(),
            log: "ptxas warning : Registers are spilled to local memory in function 'k', 8 \
                  bytes spill stores, 8 bytes spill loads\n\
                  ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                  ptxas info    : Function properties for k\n\
                  ptxas         .     8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
                .into(),
            from_cache: false,
        };
        let w = c.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("ptxas warning"), "{w:?}");
        assert_eq!(w[1], "k: 8 bytes spill stores, 8 bytes spill loads");
        let clean = Compiled {
            log: "ptxas info    : Used 4 registers\n".into(),
            ..c
        };
        assert!(clean.warnings().is_empty());
    }

    #[test]
    fn a_spill_failure_names_the_function() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
            ptxas info    : Function properties for k\n\
            ptxas         .     440 bytes stack frame, 508 bytes spill stores, 624 bytes spill loads\n";
        let explained = explain_failure(log.into());
        assert!(explained.starts_with(log));
        assert!(
            explained.contains("k: 508 bytes spill stores, 624 bytes spill loads"),
            "{explained}"
        );
        assert_eq!(
            explain_failure("t.cu(1): error\n".into()),
            "t.cu(1): error\n"
        );
    }
}
