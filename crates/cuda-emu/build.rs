//! Compiles every `.cu` file of `kernels/` (and of `test_kernels/`, the emulator's self-tests)
//! as host C++ against the emulation header, plus the fiber runtime, into one static library.
//!
//! Each `.cu` gets a generated wrapper TU: the emulation header first, then the file inside its
//! own namespace (helpers of different files never clash at link time; `extern "C"` kernels keep
//! C linkage), then a function registering the file's kernels. A generated `registry.cpp` calls
//! every file's registration function, which is what pulls the wrapper objects out of the static
//! library at link time (no static initializers to get dropped).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

const RUNTIME_SOURCES: &[&str] = &["emu/runtime.cpp", "emu/fiber.cpp"];

struct KernelFile {
    path: PathBuf,
    /// Identifier derived from the file name (namespace and function-name suffix).
    id: String,
    kernels: Vec<String>,
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let kernels_dir = manifest.join("../../kernels");
    let test_kernels_dir = manifest.join("test_kernels");
    let emu_dir = manifest.join("emu");
    let fake_dir = manifest.join("fake");

    for dir in [&kernels_dir, &test_kernels_dir, &emu_dir, &fake_dir] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    println!("cargo:rerun-if-env-changed=LMI_EMU_SANITIZE");

    let mut files = Vec::new();
    for (dir, prefix) in [(&kernels_dir, "k"), (&test_kernels_dir, "t")] {
        for path in cu_files(dir) {
            println!("cargo:rerun-if-changed={}", path.display());
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("file");
            let id = format!("{prefix}_{}", sanitize(stem));
            let source = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            // Kernels may be stamped out by macros (one per element type): look for them in
            // the preprocessed text, falling back to the raw source if preprocessing fails.
            let kernels = match preprocess(&path, &id, &out, &kernels_dir) {
                Some(expanded) => find_kernels(&expanded),
                None => find_kernels(&source),
            };
            files.push(KernelFile { path, id, kernels });
        }
    }
    for dir in [&emu_dir, &fake_dir] {
        for entry in fs::read_dir(dir).expect("emu/ and fake/ folders") {
            let p = entry.expect("folder entry").path();
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    check_unique_names(&files);

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .define("LMI_EMU", None)
        .include(&emu_dir)
        .include(&kernels_dir)
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-fno-strict-aliasing")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-function")
        .flag_if_supported("-Wno-unused-variable")
        .warnings(false);
    // ISO C++ mode would already forbid contraction; make it explicit so a*b+c stays two
    // roundings whatever the compiler's defaults.
    build.flag_if_supported("-ffp-contract=off");

    println!("cargo::rustc-check-cfg=cfg(lmi_emu_asan)");
    let sanitized = env::var("LMI_EMU_SANITIZE").as_deref() == Ok("address");
    if sanitized {
        println!("cargo:rustc-cfg=lmi_emu_asan");
        build
            .define("LMI_EMU_ASAN", None)
            .flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
        println!("cargo:rustc-link-lib=dylib=asan");
    }

    for src in RUNTIME_SOURCES {
        build.file(manifest.join(src));
    }
    for f in &files {
        let wrapper = out.join(format!("wrap_{}.cpp", f.id));
        write_if_changed(&wrapper, &wrapper_source(f));
        build.file(wrapper);
    }
    let registry = out.join("registry.cpp");
    write_if_changed(&registry, &registry_source(&files));
    build.file(registry);

    build.compile("lmi_cuda_emu");

    // The fake driver links the same objects; the sanitized build has none (its runtime
    // would have to be preloaded into every process that loads it).
    let fake_out = out.join("fake");
    if sanitized {
        println!("cargo:rustc-env=LMI_CUDA_FAKE_DIR=");
    } else {
        link_fake_libraries(&build, &emu_dir, &fake_dir, &out, &fake_out);
        println!("cargo:rustc-env=LMI_CUDA_FAKE_DIR={}", fake_out.display());
    }
}

/// Links the fake `libcuda.so.1` (the driver API over the emulator's runtime and kernels, the
/// static library just built) and `libcublas.so.13` into `dir`, each with its SONAME, exporting
/// only the API (version scripts in fake/).
fn link_fake_libraries(build: &cc::Build, emu_dir: &Path, fake_dir: &Path, out: &Path, dir: &Path) {
    fs::create_dir_all(dir).expect("creating the fake driver's folder");
    let archive = out.join("liblmi_cuda_emu.a");
    let link = |soname: &str, sources: &[&str], extra: &[&Path]| {
        let mut cmd = build.get_compiler().to_command();
        cmd.args(["-shared", "-fPIC", "-fvisibility=hidden"])
            .arg("-I")
            .arg(emu_dir)
            .arg("-I")
            .arg(fake_dir);
        for src in sources {
            cmd.arg(fake_dir.join(src));
        }
        cmd.args(extra)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(format!(
                "-Wl,--version-script={}",
                fake_dir
                    .join(format!(
                        "{}.map",
                        soname.split('.').next().unwrap_or(soname)
                    ))
                    .display()
            ))
            .args(["-Wl,--no-undefined", "-lpthread", "-ldl", "-o"])
            .arg(dir.join(soname));
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running the C++ compiler for {soname}: {e}"));
        assert!(
            status.success(),
            "linking the fake {soname} failed: {cmd:?}"
        );
    };
    link(
        "libcuda.so.1",
        &["driver.cpp", "cubin.cpp", "gemm.cpp"],
        &[archive.as_path()],
    );
    link("libcublas.so.13", &["blas.cpp"], &[]);
}

/// The file after the C preprocessor (as the emulator compiles it: `LMI_EMU` defined,
/// `kernels/` on the include path).
fn preprocess(path: &Path, id: &str, out: &Path, kernels_dir: &Path) -> Option<String> {
    let probe = out.join(format!("expand_{id}.cpp"));
    write_if_changed(&probe, &format!("#include \"{}\"\n", path.display()));
    let expanded = cc::Build::new()
        .cpp(true)
        .std("c++17")
        .define("LMI_EMU", None)
        .include(kernels_dir)
        .file(&probe)
        .cargo_metadata(false)
        .try_expand()
        .ok()?;
    String::from_utf8(expanded).ok()
}

fn cu_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    v.sort();
    v
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Removes `//` and `/* */` comments (keeping string literals intact) so commented-out kernels
/// are not registered.
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            out.push_str(&src[start..i]);
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i = (i + 2).min(b.len());
            out.push(' ');
        } else {
            let ch = src[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The `extern "C" __global__` kernels of a file, in source order.
fn find_kernels(src: &str) -> Vec<String> {
    let re = regex::Regex::new(
        r#"extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\("#,
    )
    .expect("kernel regex");
    re.captures_iter(&strip_comments(src))
        .map(|c| c[1].to_string())
        .collect()
}

fn check_unique_names(files: &[KernelFile]) {
    let mut seen: std::collections::HashMap<&str, &Path> = Default::default();
    for f in files {
        for k in &f.kernels {
            if let Some(prev) = seen.insert(k, &f.path) {
                panic!(
                    "kernel `{k}` is defined in both {} and {}: kernel names must be unique \
                     across kernels/ and test_kernels/",
                    prev.display(),
                    f.path.display()
                );
            }
        }
    }
}

fn wrapper_source(f: &KernelFile) -> String {
    let file_name = f.path.file_name().and_then(|s| s.to_str()).unwrap_or("?");
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by lmi-cuda-emu's build.rs from {file_name}."
    );
    s.push_str("#include \"cuda_emu.h\"\n");
    let _ = writeln!(s, "namespace lmi_emu_f_{} {{", f.id);
    let _ = writeln!(s, "#include \"{}\"", f.path.display());
    s.push_str("}\n");
    let _ = writeln!(s, "void lmi_emu_register_file_{}() {{", f.id);
    for k in &f.kernels {
        let _ = writeln!(
            s,
            "    ::lmi_emu::register_kernel(\"{k}\", \"{file_name}\", &lmi_emu_f_{}::{k});",
            f.id
        );
    }
    s.push_str("}\n");
    s
}

fn registry_source(files: &[KernelFile]) -> String {
    let mut s = String::from("// Generated by lmi-cuda-emu's build.rs.\n");
    for f in files {
        let _ = writeln!(s, "void lmi_emu_register_file_{}();", f.id);
    }
    s.push_str("namespace lmi_emu {\nvoid register_all_kernels() {\n");
    for f in files {
        let _ = writeln!(s, "    lmi_emu_register_file_{}();", f.id);
    }
    s.push_str("}\n}  // namespace lmi_emu\n");
    s
}

fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
