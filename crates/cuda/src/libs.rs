//! Finding and loading the CUDA libraries (driver, NVRTC, cuBLAS) without panicking.
//!
//! cudarc loads each library lazily by name and panics when none of its candidate names
//! loads. So before any cudarc call, [`load`] finds the library itself, in this order:
//! 1. `LMI_CUDA_LIB_DIR`: a directory (or a `:`-separated list) holding the libraries;
//! 2. the system loader's search by name, over cudarc's own candidate names (`libnvrtc.so`,
//!    …, `libnvrtc.so.13`, but no other major's `libnvrtc.so.12`), as cudarc will look;
//! 3. NVRTC and cuBLAS only: the pip wheels (`nvidia-cuda-nvrtc`, `nvidia-cublas`) of the
//!    `python3` on `PATH`, in `nvidia/cu13/lib` under any entry of its `sys.path` (user or
//!    system site-packages, a virtualenv, `PYTHONPATH`).
//!
//! A library found by path is loaded by path and kept loaded for the life of the process:
//! glibc then answers cudarc's later load by name (`libnvrtc.so.13`) with the same object,
//! because it matches an already-loaded library by its SONAME. [`load`] checks that cudarc
//! does resolve to the same library (one symbol's address must match) before anyone calls it.

use std::ffi::{CStr, OsStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::error::{CudaError, Result};

/// The CUDA major version of cudarc's bindings (its `cuda-13000` feature).
pub const CUDA_MAJOR: u32 = 13;

/// Directory (or `:`-separated list) searched first for the CUDA libraries.
pub const LIB_DIR_ENV: &str = "LMI_CUDA_LIB_DIR";

/// Set by [`use_lib_dir`]: searched first, in place of [`LIB_DIR_ENV`].
static LIB_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Makes `dir` the first place the libraries are looked for, as
/// [`LIB_DIR_ENV`] does, without touching the environment: how tests run the device layer on
/// the fake driver (`lmi_cuda_emu::fake`). Must come before any library is loaded; a second
/// call must name the same directory.
pub fn use_lib_dir(dir: &Path) -> Result<()> {
    let set = LIB_DIR.get_or_init(|| dir.to_path_buf());
    if set != dir {
        return Err(CudaError::Invalid(format!(
            "the CUDA libraries are already taken from {}, not {}",
            set.display(),
            dir.display()
        )));
    }
    if let Some(lib) = [CudaLib::Driver, CudaLib::Nvrtc, CudaLib::Cublas]
        .into_iter()
        .find(|&l| loaded(l).is_some_and(|found| found.origin != Origin::EnvDir))
    {
        return Err(CudaError::Invalid(format!(
            "{} is already loaded from elsewhere: choose the library folder before the first \
             CUDA call",
            lib.label()
        )));
    }
    Ok(())
}

/// One of the CUDA libraries the device layer loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaLib {
    /// `libcuda`, installed with the NVIDIA driver.
    Driver,
    Nvrtc,
    Cublas,
}

/// Where a library was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    EnvDir,
    System,
    PipWheel,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::EnvDir => LIB_DIR_ENV,
            Origin::System => "the system library path",
            Origin::PipWheel => "a pip wheel",
        })
    }
}

impl CudaLib {
    pub fn label(self) -> &'static str {
        match self {
            CudaLib::Driver => "the NVIDIA driver (libcuda)",
            CudaLib::Nvrtc => "NVRTC (libnvrtc)",
            CudaLib::Cublas => "cuBLAS (libcublas)",
        }
    }

    /// cudarc's name for the library, the stem of its candidate file names.
    fn stem(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuda",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
        }
    }

    /// File names looked for in a directory, preferred first.
    fn file_names(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1", "libcuda.so"],
            CudaLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so"],
            CudaLib::Cublas => &["libcublas.so.13", "libcublas.so"],
        }
    }

    /// A symbol every version exports: proves the file is the library, and tells which copy
    /// cudarc resolved.
    fn symbol(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuInit",
            CudaLib::Nvrtc => "nvrtcVersion",
            CudaLib::Cublas => "cublasCreate_v2",
        }
    }

    /// Whether to try this cudarc candidate name on the system path: not another CUDA major's
    /// NVRTC or cuBLAS (`libnvrtc.so.12`), which would shadow a CUDA 13 wheel. The driver's
    /// name is `libcuda.so.1` whatever its version.
    fn accepts_system_name(self, name: &str) -> bool {
        match name.rsplit_once(".so.") {
            Some((_, major)) if self != CudaLib::Driver => major == CUDA_MAJOR.to_string(),
            _ => true,
        }
    }

    /// The driver comes with the kernel module, never from pip.
    fn ships_as_wheel(self) -> bool {
        self != CudaLib::Driver
    }

    /// What to install when the library is missing.
    pub fn install_hint(self) -> &'static str {
        match self {
            CudaLib::Driver => {
                "install the NVIDIA driver (CUDA 13 needs driver 580 or newer; in a container, \
                 run it with the NVIDIA Container Toolkit, e.g. `docker run --gpus all`)"
            }
            CudaLib::Nvrtc => {
                "install it with `python3 -m pip install nvidia-cuda-nvrtc==13.5.37` (enough for \
                 the kernel compile check) or install the CUDA 13 toolkit"
            }
            CudaLib::Cublas => {
                "install it with `python3 -m pip install nvidia-cublas` (13.x) or install the \
                 CUDA 13 toolkit"
            }
        }
    }

    /// The address cudarc resolves [`CudaLib::symbol`] to, or `None` if cudarc would find no
    /// library.
    fn cudarc_symbol(self) -> Option<usize> {
        let name = self.symbol().as_bytes();
        // SAFETY: `is_culib_present` only opens and closes candidates. `culib` panics only when
        // no candidate loads, which `is_culib_present` has just ruled out (and the copy we hold
        // stays loaded); looking up a symbol has no side effects.
        unsafe {
            let lib = match self {
                CudaLib::Driver => {
                    if !cudarc::driver::sys::is_culib_present() {
                        return None;
                    }
                    cudarc::driver::sys::culib()
                }
                CudaLib::Nvrtc => {
                    if !cudarc::nvrtc::sys::is_culib_present() {
                        return None;
                    }
                    cudarc::nvrtc::sys::culib()
                }
                CudaLib::Cublas => {
                    if !cudarc::cublas::sys::is_culib_present() {
                        return None;
                    }
                    cudarc::cublas::sys::culib()
                }
            };
            lib.get::<*const c_void>(name).ok().map(|s| *s as usize)
        }
    }
}

/// A library loaded for the life of the process.
#[derive(Debug)]
pub struct LoadedLib {
    pub lib: CudaLib,
    /// The file loaded (resolved by the loader when found by name).
    pub path: PathBuf,
    pub origin: Origin,
    _handle: libloading::Library,
    /// Libraries it loads by name at run time, loaded first from its folder (see
    /// [`preload_companions`]).
    _companions: Vec<libloading::Library>,
}

/// Loads `lib` once per process; later calls return the same library or the same error.
/// After `Ok`, cudarc's functions for it can be called without a panic.
pub fn load(lib: CudaLib) -> Result<&'static LoadedLib> {
    cell(lib)
        .get_or_init(|| find_and_load(lib))
        .as_ref()
        .map_err(|msg| CudaError::Unavailable(msg.clone()))
}

/// The process's answer for `lib` (never dropped: the handle keeps the library loaded for
/// cudarc).
fn cell(lib: CudaLib) -> &'static OnceLock<Result<LoadedLib, String>> {
    static DRIVER: OnceLock<Result<LoadedLib, String>> = OnceLock::new();
    static NVRTC: OnceLock<Result<LoadedLib, String>> = OnceLock::new();
    static CUBLAS: OnceLock<Result<LoadedLib, String>> = OnceLock::new();
    match lib {
        CudaLib::Driver => &DRIVER,
        CudaLib::Nvrtc => &NVRTC,
        CudaLib::Cublas => &CUBLAS,
    }
}

/// `lib` if it has been loaded.
fn loaded(lib: CudaLib) -> Option<&'static LoadedLib> {
    cell(lib).get().and_then(|r| r.as_ref().ok())
}

fn find_and_load(lib: CudaLib) -> Result<LoadedLib, String> {
    let mut tried = Vec::new();
    let loaded = search(lib, &mut tried).ok_or_else(|| not_found(lib, &tried))?;
    check_cudarc_agrees(&loaded)?;
    tracing::debug!(
        lib = lib.label(),
        path = %loaded.path.display(),
        from = %loaded.origin,
        "CUDA library loaded"
    );
    Ok(loaded)
}

fn search(lib: CudaLib, tried: &mut Vec<String>) -> Option<LoadedLib> {
    let dirs = match LIB_DIR.get() {
        Some(dir) => Some(vec![dir.clone()]),
        None => std::env::var_os(LIB_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(|v| std::env::split_paths(&v).collect::<Vec<PathBuf>>()),
    };
    if let Some(dirs) = dirs {
        if let Some(found) = load_from_dirs(lib, &dirs, Origin::EnvDir, tried) {
            return Some(found);
        }
        // A folder with only some of the libraries (the driver alone, say) is normal; one
        // with none of them is likely a mistake.
        let holds_any = dirs.iter().any(|d| {
            [CudaLib::Driver, CudaLib::Nvrtc, CudaLib::Cublas]
                .iter()
                .any(|l| l.file_names().iter().any(|f| d.join(f).exists()))
        });
        let dirs_text = std::env::join_paths(&dirs)
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let wanted = lib.file_names()[0];
        if holds_any {
            tracing::debug!("{LIB_DIR_ENV}={dirs_text} holds no {wanted}; searching elsewhere");
        } else {
            tracing::warn!(
                "{LIB_DIR_ENV}={dirs_text} holds no usable {wanted}; searching elsewhere"
            );
        }
    } else {
        tried.push(format!("{LIB_DIR_ENV} (unset)"));
    }

    let names = cudarc::get_lib_name_candidates(lib.stem());
    for name in names.iter().filter(|n| lib.accepts_system_name(n)) {
        if let Some(found) = open(lib, OsStr::new(name), Origin::System) {
            return Some(found);
        }
    }
    tried.push(format!(
        "the system library path ({}, …)",
        lib.file_names().join(", ")
    ));

    if lib.ships_as_wheel() {
        let dirs = pip_lib_dirs(Command::new("python3"));
        if dirs.is_empty() {
            tried.push("the pip wheels of python3 (none has nvidia/cu13/lib)".into());
        }
        return load_from_dirs(lib, &dirs, Origin::PipWheel, tried);
    }
    None
}

fn load_from_dirs(
    lib: CudaLib,
    dirs: &[PathBuf],
    origin: Origin,
    tried: &mut Vec<String>,
) -> Option<LoadedLib> {
    for dir in dirs {
        for file in lib.file_names() {
            let path = dir.join(file);
            if !path.exists() {
                continue;
            }
            let companions = preload_companions(lib, dir);
            if let Some(mut found) = open(lib, path.as_os_str(), origin) {
                found._companions = companions;
                return Some(found);
            }
            tried.push(format!("{} (does not load)", path.display()));
        }
        tried.push(format!("{} ({origin})", dir.display()));
    }
    None
}

/// Opens a library by path or by name; `None` unless it loads and exports the library's symbol.
fn open(lib: CudaLib, name: &OsStr, origin: Origin) -> Option<LoadedLib> {
    // SAFETY: loading runs the library's initializers; the CUDA libraries' have no
    // preconditions on the host process.
    let handle = unsafe { libloading::Library::new(name) }.ok()?;
    let addr = symbol_address(&handle, lib.symbol())?;
    let path = file_of(addr).unwrap_or_else(|| PathBuf::from(name));
    Some(LoadedLib {
        lib,
        path,
        origin,
        _handle: handle,
        _companions: Vec::new(),
    })
}

/// NVRTC opens `libnvrtc-builtins.so.13.x` by name when it compiles. The 13.0 wheels carry no
/// RPATH, so from a folder off the loader's path (a wheel, `LMI_CUDA_LIB_DIR`) that fails
/// ("failed to open libnvrtc-builtins.so.13.0") unless the folder's copy is already loaded:
/// the loader then answers the name with it (by SONAME).
fn preload_companions(lib: CudaLib, dir: &Path) -> Vec<libloading::Library> {
    if lib != CudaLib::Nvrtc {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("libnvrtc-builtins.so.{CUDA_MAJOR}");
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        // SAFETY: NVRTC's builtins library has no initializers with preconditions.
        .filter_map(|p| unsafe { libloading::Library::new(&p) }.ok())
        .collect()
}

fn check_cudarc_agrees(loaded: &LoadedLib) -> Result<(), String> {
    let ours = symbol_address(&loaded._handle, loaded.lib.symbol());
    let theirs = loaded.lib.cudarc_symbol();
    if ours.is_some() && ours == theirs {
        return Ok(());
    }
    let theirs = match theirs.and_then(file_of) {
        Some(p) => format!("resolves it to {}", p.display()),
        None => "finds none of its candidate names".to_string(),
    };
    Err(format!(
        "{} was found at {} (from {}), but cudarc, which loads it by name, {theirs}: make the \
         wanted copy the only one on the loader path, or set {LIB_DIR_ENV} to its directory",
        loaded.lib.label(),
        loaded.path.display(),
        loaded.origin,
    ))
}

fn not_found(lib: CudaLib, tried: &[String]) -> String {
    let missing = match lib {
        CudaLib::Driver => "no NVIDIA driver found".to_string(),
        _ => format!("{} not found", lib.label()),
    };
    format!(
        "{missing} (looked in: {}): {}, or set {LIB_DIR_ENV} to the directory holding {}",
        tried.join("; "),
        lib.install_hint(),
        lib.file_names()[0]
    )
}

fn symbol_address(handle: &libloading::Library, name: &str) -> Option<usize> {
    // SAFETY: the symbol is read as an address only, never called through this type.
    let sym = unsafe { handle.get::<*const c_void>(name.as_bytes()) }.ok()?;
    Some(*sym as usize)
}

/// The file of the loaded object that holds `addr`.
fn file_of(addr: usize) -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr reads the loader's tables and fills `info`; `dli_fname` then points to a
    // NUL-terminated string owned by the loader, copied out at once.
    unsafe {
        if libc::dladdr(addr as *const c_void, info.as_mut_ptr()) == 0 {
            return None;
        }
        let fname = info.assume_init().dli_fname;
        if fname.is_null() {
            return None;
        }
        Some(PathBuf::from(OsStr::from_bytes(
            CStr::from_ptr(fname).to_bytes(),
        )))
    }
}

/// The `nvidia/cu13/lib` folders of the pip wheels `python` sees, in its `sys.path` order.
/// Empty when there is no such Python or no such wheel.
fn pip_lib_dirs(mut python: Command) -> Vec<PathBuf> {
    // Every `nvidia` package portion: the namespace package's own path where it imports, and
    // `<entry>/nvidia` for each `sys.path` entry (covers user and system site-packages,
    // virtualenvs and PYTHONPATH).
    const SCRIPT: &str = "import os, sys\n\
        paths = []\n\
        try:\n    import nvidia\n    paths += list(nvidia.__path__)\n\
        except Exception:\n    pass\n\
        paths += [os.path.join(p, 'nvidia') for p in sys.path if p]\n\
        print('\\n'.join(paths))\n";
    // The script's `''` (current directory) entry is skipped; run it from a neutral place.
    let output = python
        .arg("-c")
        .arg(SCRIPT)
        .current_dir(std::env::temp_dir())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(output) = output else {
        return Vec::new();
    };
    if !output.status.success() {
        return Vec::new();
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in output.stdout.split(|&b| b == b'\n') {
        let dir = Path::new(OsStr::from_bytes(line)).join("cu13/lib");
        if !line.is_empty() && dir.is_dir() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_discovery_finds_a_wheel_on_the_python_path() {
        let site = tempfile::tempdir().expect("tempdir");
        let lib = site.path().join("nvidia/cu13/lib");
        std::fs::create_dir_all(&lib).expect("mkdir");
        let mut python = Command::new("python3");
        python.env("PYTHONPATH", site.path());
        let dirs = pip_lib_dirs(python);
        if dirs.is_empty() && Command::new("python3").arg("-V").output().is_err() {
            eprintln!("no python3: pip discovery not tested");
            return;
        }
        assert!(dirs.contains(&lib), "{dirs:?} lacks {}", lib.display());
    }

    #[test]
    fn other_cuda_majors_are_not_taken_from_the_system_path() {
        let nvrtc = |n: &str| CudaLib::Nvrtc.accepts_system_name(n);
        assert!(nvrtc("libnvrtc.so") && nvrtc("libnvrtc.so.13"));
        assert!(!nvrtc("libnvrtc.so.12") && !nvrtc("libnvrtc.so.1"));
        assert!(!CudaLib::Cublas.accepts_system_name("libcublas.so.11"));
        assert!(CudaLib::Driver.accepts_system_name("libcuda.so.1"));
    }

    #[test]
    fn no_python_means_no_wheels() {
        assert!(pip_lib_dirs(Command::new("/nonexistent/python3")).is_empty());
    }

    #[test]
    fn a_file_that_is_not_the_library_is_skipped_with_a_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("libnvrtc.so.13"), b"not an ELF file").expect("write");
        let mut tried = Vec::new();
        let found = load_from_dirs(
            CudaLib::Nvrtc,
            &[dir.path().to_path_buf()],
            Origin::EnvDir,
            &mut tried,
        );
        assert!(found.is_none());
        assert!(
            tried[0].contains("libnvrtc.so.13 (does not load)"),
            "{tried:?}"
        );
    }

    #[test]
    fn the_not_found_message_says_what_to_install() {
        let msg = not_found(CudaLib::Nvrtc, &["LMI_CUDA_LIB_DIR (unset)".into()]);
        assert!(
            msg.contains("pip install nvidia-cuda-nvrtc==13.5.37"),
            "{msg}"
        );
        assert!(msg.contains("LMI_CUDA_LIB_DIR"), "{msg}");
        let msg = not_found(CudaLib::Driver, &[]);
        assert!(msg.starts_with("no NVIDIA driver found"), "{msg}");
        assert!(msg.contains("install the NVIDIA driver"), "{msg}");
    }
}
