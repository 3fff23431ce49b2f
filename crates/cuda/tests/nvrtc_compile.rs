//! CI check: every embedded kernel compiles under NVRTC for sm_80 and sm_90, through the
//! engine's own path (its options, disk cache), with register spills as errors, on the newest
//! NVRTC 13.x and on the oldest (`LMI_NVRTC_OLDEST`). Prints registers / stack / spills per
//! kernel (shown with `--nocapture` or on failure).
//!
//! Without NVRTC the tests print why and pass, unless `LMI_REQUIRE_NVRTC=1` (set by CI).

use lmi_cuda::ptxas::{self, Row};
use lmi_cuda::{Arch, CudaError, KernelCache, KernelSource, Nvrtc, SpillPolicy, kernels};

const ARCHS: [Arch; 2] = [Arch::SM80, Arch::SM90];

/// NVRTC, or `None` (after saying why) when it is missing and not required.
fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) if std::env::var("LMI_REQUIRE_NVRTC").is_ok_and(|v| v == "1") => {
            panic!("LMI_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {e}")
        }
        Err(e) => {
            eprintln!("NVRTC compile check skipped: {e}");
            None
        }
    }
}

fn fresh_cache() -> (tempfile::TempDir, KernelCache) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::at(dir.path());
    (dir, cache)
}

#[test]
fn every_embedded_kernel_compiles_without_spills() {
    let Some(nvrtc) = nvrtc() else { return };
    let (major, minor) = nvrtc.version();
    println!("NVRTC {major}.{minor} ({})", nvrtc.path().display());
    if kernels::SOURCES.is_empty() {
        println!("kernels/ has no .cu file yet");
    }
    let (_dir, cache) = fresh_cache();
    let mut failures = Vec::new();
    let mut compiled = Vec::new();
    for arch in ARCHS {
        for source in kernels::SOURCES {
            match nvrtc.compile_cached(source, kernels::HEADERS, arch, &cache, SpillPolicy::Error) {
                Ok(c) => compiled.push((source.name, arch, c)),
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    let reports: Vec<_> = compiled
        .iter()
        .map(|(file, arch, c)| (*file, *arch, c.report()))
        .collect();
    let rows: Vec<Row> = reports
        .iter()
        .flat_map(|(file, arch, report)| {
            report.iter().map(move |function| Row {
                file,
                arch: arch.to_string(),
                function,
            })
        })
        .collect();
    println!("{}", ptxas::table(&rows));
    for (file, arch, c) in &compiled {
        assert!(
            c.cubin.starts_with(b"\x7fELF"),
            "{file} for {arch}: not a CUBIN"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_engine_compiles_everything_for_its_arch() {
    let Some(nvrtc) = nvrtc() else { return };
    let (_dir, cache) = fresh_cache();
    let all = nvrtc
        .compile_all(Arch::SM90, &cache, SpillPolicy::Warn)
        .expect("compile_all");
    assert_eq!(all.len(), kernels::SOURCES.len());
    // A second start reads every kernel from the cache.
    let again = nvrtc
        .compile_all(Arch::SM90, &cache, SpillPolicy::Warn)
        .expect("compile_all");
    for ((source, first), (_, second)) in all.iter().zip(&again) {
        assert!(second.from_cache, "{} not cached", source.name);
        assert_eq!(first.cubin, second.cubin);
    }
}

const GOOD: KernelSource = KernelSource {
    name: "good.cu",
    text: r#"#include "common.cuh"
extern "C" __global__ void row_sum(const bf16* x, float* out, unsigned cols) {
    __shared__ float scratch[32];
    float v = 0.0f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x)
        v += load_f32(x, (unsigned long long)blockIdx.x * cols + c);
    v = block_sum(v, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = __expf(v);
}
"#,
};

#[test]
fn a_kernel_using_the_header_compiles_and_is_cached() {
    let Some(nvrtc) = nvrtc() else { return };
    let (_dir, cache) = fresh_cache();
    for arch in ARCHS {
        let c = nvrtc
            .compile_cached(&GOOD, kernels::HEADERS, arch, &cache, SpillPolicy::Error)
            .expect("compiles");
        assert!(!c.from_cache);
        assert!(c.cubin.starts_with(b"\x7fELF"));
        let report = c.report();
        let row_sum = report
            .iter()
            .find(|f| f.name == "row_sum")
            .expect("row_sum reported");
        assert!(
            row_sum.entry && row_sum.registers.is_some_and(|r| r > 0),
            "{report:?}"
        );
        assert_eq!(row_sum.shared_mem_bytes, 128, "{report:?}");
        assert!(!row_sum.spills());
        let hit = nvrtc
            .compile_cached(&GOOD, kernels::HEADERS, arch, &cache, SpillPolicy::Error)
            .expect("cached");
        assert!(hit.from_cache);
        assert_eq!((hit.cubin, hit.log), (c.cubin, c.log));
    }
}

#[test]
fn a_syntax_error_comes_back_with_the_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let bad = KernelSource {
        name: "bad.cu",
        text: "#include \"common.cuh\"\nextern \"C\" __global__ void k(float* o) { o[0] = 1.0f +; }\n",
    };
    let err = nvrtc
        .compile_cached(
            &bad,
            kernels::HEADERS,
            Arch::SM90,
            &KernelCache::disabled(),
            SpillPolicy::Error,
        )
        .expect_err("must not compile");
    let CudaError::Compile { file, arch, log } = &err else {
        panic!("not a compile error: {err}");
    };
    assert_eq!((file.as_str(), arch.as_str()), ("bad.cu", "sm_90"));
    assert!(log.contains("bad.cu(2): error"), "{log}");
    assert!(
        err.to_string()
            .contains("NVRTC could not compile bad.cu for sm_90")
    );
}

/// 48 live floats in at most 32 registers (1024 threads, 2 blocks per SM).
const SPILL: KernelSource = KernelSource {
    name: "spill.cu",
    text: r#"
extern "C" __global__ void __launch_bounds__(1024, 2) spill(float* out, const float* in) {
    float v[48];
#pragma unroll
    for (int i = 0; i < 48; i++) v[i] = in[threadIdx.x * 48 + i];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 48; i++) acc += v[i] * v[47 - i] * v[(i * 7) % 48];
#pragma unroll
    for (int i = 0; i < 48; i++) out[threadIdx.x * 48 + i] = v[i] * acc;
}
"#,
};

#[test]
fn a_spilling_kernel_fails_for_sm_90_in_ci() {
    let Some(nvrtc) = nvrtc() else { return };
    let (_dir, cache) = fresh_cache();
    let err = nvrtc
        .compile_cached(
            &SPILL,
            kernels::HEADERS,
            Arch::SM90,
            &cache,
            SpillPolicy::Error,
        )
        .expect_err("a spill must fail the compilation");
    let CudaError::Compile { log, .. } = &err else {
        panic!("not a compile error: {err}");
    };
    assert!(log.contains("register spills are errors"), "{log}");
    assert!(log.contains("spill: "), "{log}");
    assert!(
        std::fs::read_dir(cache.dir().expect("dir")).map_or(true, |mut d| d.next().is_none()),
        "a failure was cached"
    );
}

#[test]
fn a_spilling_kernel_compiles_with_a_warning_at_run_time() {
    let Some(nvrtc) = nvrtc() else { return };
    let (_dir, cache) = fresh_cache();
    let c = nvrtc
        .compile_cached(
            &SPILL,
            kernels::HEADERS,
            Arch::SM90,
            &cache,
            SpillPolicy::Warn,
        )
        .expect("the engine's compilation lets a spill through");
    assert!(c.cubin.starts_with(b"\x7fELF"));
    let warnings = c.warnings();
    assert!(
        warnings.iter().any(|w| w.starts_with("spill: ")),
        "{warnings:?}\n{}",
        c.log
    );
}

/// CI installs the oldest NVRTC 13.x as well (`LMI_NVRTC_OLDEST`: its library folder); the
/// device may well have it (the one beside PyTorch). Every kernel must compile there without
/// spills too: the check above runs again in a child process that loads that NVRTC.
#[test]
fn every_kernel_compiles_without_spills_on_the_oldest_nvrtc_too() {
    if std::env::var_os("LMI_NVRTC_CHILD").is_some() {
        return; // the child runs the check above only
    }
    let Some(dir) = std::env::var_os("LMI_NVRTC_OLDEST") else {
        assert!(
            !std::env::var("LMI_REQUIRE_NVRTC").is_ok_and(|v| v == "1"),
            "LMI_REQUIRE_NVRTC=1 but LMI_NVRTC_OLDEST (the oldest NVRTC 13.x's library folder) is unset"
        );
        eprintln!("LMI_NVRTC_OLDEST is unset: the oldest NVRTC is not checked");
        return;
    };
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "every_embedded_kernel_compiles_without_spills",
            "--nocapture",
        ])
        .env("LMI_CUDA_LIB_DIR", &dir)
        .env("LMI_NVRTC_CHILD", "1")
        .env("LMI_REQUIRE_NVRTC", "1")
        .output()
        .expect("running the check with the oldest NVRTC");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "with the NVRTC of {}:\n{stdout}\n{}",
        std::path::Path::new(&dir).display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NVRTC 13.0 ("),
        "the child did not load NVRTC 13.0 from {}:\n{stdout}",
        std::path::Path::new(&dir).display()
    );
}

#[test]
fn an_arch_nvrtc_lacks_is_a_clear_error() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = nvrtc
        .compile_cached(
            &GOOD,
            kernels::HEADERS,
            Arch { major: 5, minor: 2 },
            &KernelCache::disabled(),
            SpillPolicy::Warn,
        )
        .expect_err("sm_52 is not supported by CUDA 13");
    assert!(
        err.to_string().contains("cannot compile for sm_52"),
        "{err}"
    );
}
