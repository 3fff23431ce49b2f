//! lmi_cuda's real host code (`CudaDevice`, through cudarc) on the fake driver and cuBLAS:
//! real NVRTC CUBINs loaded, launches marshalled through the driver's parameter layout,
//! staged async copies, graphs, cuBLAS products; and the driver's refusals, with its codes.
//!
//! NVRTC compiles the kernels the fake loads: without it these tests say so and pass, unless
//! `LMI_REQUIRE_NVRTC=1` (CI). Faults poison a context for good, as on a GPU, so each fault
//! case runs in a child process.

use std::process::Command;
use std::sync::{Arc, OnceLock};

use cudarc::driver::result as drv;
use cudarc::driver::sys::{self as drv_sys, CUresult};
use half::bf16;
use lmi_cuda::{
    Arch, Arg, CudaDevice, DevPtr, Device, DeviceExt, ElemType, Gemm, KernelSource, LaunchConfig,
    Nvrtc, kernels,
};
use lmi_cuda_emu::{EmuDevice, fake};

/// The fake device, shared by the tests of this process; `None` (after saying why) without
/// NVRTC, unless it is required.
fn device() -> Option<Arc<CudaDevice>> {
    static DEV: OnceLock<Result<Arc<CudaDevice>, String>> = OnceLock::new();
    let dev = DEV.get_or_init(|| {
        fake::install()?;
        Nvrtc::load().map_err(|e| e.to_string())?;
        CudaDevice::open(0).map(Arc::new).map_err(|e| e.to_string())
    });
    match dev {
        Ok(d) => Some(d.clone()),
        Err(e) if std::env::var("LMI_REQUIRE_NVRTC").is_ok_and(|v| v == "1") => {
            panic!("LMI_REQUIRE_NVRTC=1 but the fake driver cannot be used: {e}")
        }
        Err(e) => {
            eprintln!("fake driver tests skipped: {e}");
            None
        }
    }
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Runs `f` with `args` built from buffers holding `inputs` on `dev`, and returns every
/// buffer's contents after.
fn run_kernel<D: Device>(
    dev: &D,
    name: &str,
    cfg: LaunchConfig,
    buffers: &[Vec<f32>],
    scalars: &[Arg],
) -> Vec<Vec<f32>> {
    let ptrs: Vec<DevPtr> = buffers
        .iter()
        .map(|b| {
            let p = dev.alloc(b.len() * 4).unwrap();
            dev.htod_slice(b, p).unwrap();
            p
        })
        .collect();
    let mut args: Vec<Arg> = ptrs.iter().map(|&p| p.into()).collect();
    args.extend_from_slice(scalars);
    let f = dev.function(name).unwrap();
    dev.launch(f, &cfg, &args).unwrap();
    let out = ptrs
        .iter()
        .zip(buffers)
        .map(|(&p, b)| dev.dtoh_vec::<f32>(p, b.len()).unwrap())
        .collect();
    for p in ptrs {
        dev.free(p);
    }
    out
}

#[test]
fn the_fake_is_an_sm90_device_with_cuda_13_libraries() {
    let Some(dev) = device() else { return };
    let info = dev.info();
    assert!(info.name.contains("fake"), "{}", info.name);
    assert_eq!(info.compute_capability, (9, 0));
    assert_eq!(info.max_shared_mem_per_block, 227 * 1024);
    assert!(!info.emulated, "the host code takes it for a GPU");
    let v = dev.versions();
    assert_eq!((v.driver, v.cublas.0), ((13, 0), 13));
}

#[test]
fn launches_through_the_driver_match_the_emulator_bit_for_bit() {
    let Some(dev) = device() else { return };
    let emu = EmuDevice::new();
    let n = 1000usize;
    let (x, w) = (random(4 * n, 1), random(n, 2));
    for (name, cfg, buffers, scalars) in [
        (
            "add_f32",
            LaunchConfig::linear(4, 256),
            vec![random(n, 3), random(n, 4)],
            vec![Arg::U64(n as u64)],
        ),
        (
            "silu_mul_f32",
            LaunchConfig::linear(8, 256),
            vec![vec![0.0; 2 * n], x.clone()],
            vec![Arg::U32(n as u32), Arg::U64(2 * n as u64)],
        ),
        (
            "rms_norm_f32",
            LaunchConfig::linear(4, 256),
            vec![vec![0.0; 4 * n], x.clone(), w.clone()],
            vec![Arg::U32(n as u32), Arg::F32(1e-5)],
        ),
    ] {
        let want = run_kernel(&emu, name, cfg, &buffers, &scalars);
        let got = run_kernel(dev.as_ref(), name, cfg, &buffers, &scalars);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn every_parameter_width_lands_where_the_cubin_puts_it() {
    let Some(dev) = device() else { return };
    let (f, _module) = test_function(&dev, "fake_params");
    let y = dev.alloc(6 * 8).unwrap();
    let x = dev.alloc(4).unwrap();
    dev.htod_slice(&[2.5f32], x).unwrap();
    // The launch below goes to the NULL stream, which the device's stream does not wait for.
    dev.synchronize().unwrap();
    // y, a: u32, b: f64, c: f32, d: u64, e: i32, f: pointer.
    let mut values: Vec<[u8; 8]> = vec![
        y.0.to_le_bytes(),
        u64::from(7u32).to_le_bytes(),
        (-1.25f64).to_le_bytes(),
        u64::from(0.5f32.to_bits()).to_le_bytes(),
        (1u64 << 40).to_le_bytes(),
        u64::from((-3i32) as u32).to_le_bytes(),
        x.0.to_le_bytes(),
    ];
    let mut ptrs: Vec<*mut std::ffi::c_void> =
        values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    // SAFETY: the function takes these seven parameters, each read from the first bytes of its
    // 8-byte slot (little-endian); the buffers are live device memory.
    unsafe {
        drv::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, std::ptr::null_mut(), &mut ptrs)
            .expect("launch");
    }
    sync().unwrap();
    let got = dev.dtoh_vec::<f64>(y, 6).unwrap();
    assert_eq!(got, vec![7.0, -1.25, 0.5, (1u64 << 40) as f64, -3.0, 2.5]);
    dev.free(x);
    dev.free(y);
}

fn to_bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

#[test]
fn products_through_cublas_match_the_emulator() {
    let Some(dev) = device() else { return };
    let emu = EmuDevice::new();
    for (m, n, k, x_type, out_type, accumulate) in [
        (1, 7, 16, ElemType::BF16, ElemType::F32, false),
        (5, 33, 70, ElemType::BF16, ElemType::BF16, false),
        (9, 12, 300, ElemType::F32, ElemType::F32, true),
        (64, 96, 576, ElemType::BF16, ElemType::F32, true),
    ] {
        let x = random(m * k, 11);
        let w = random(n * k, 12);
        let out0 = random(m * n, 13);
        let results: Vec<Vec<f32>> = [&emu as &dyn DeviceLike, dev.as_ref() as &dyn DeviceLike]
            .iter()
            .map(|d| d.product(m, n, k, x_type, out_type, accumulate, &x, &w, &out0))
            .collect();
        for (i, (g, e)) in results[1].iter().zip(&results[0]).enumerate() {
            // The fake sums in eight lanes, the emulator in order: f32 rounding apart.
            let tol = 1e-5 * k as f32
                + if out_type == ElemType::BF16 {
                    1e-2 * e.abs()
                } else {
                    0.0
                };
            assert!(
                (g - e).abs() <= tol,
                "{m}x{n}x{k} {x_type:?}->{out_type:?}: element {i}: {g} vs {e}"
            );
        }
    }
}

/// The product on either device, from host data.
trait DeviceLike {
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        m: usize,
        n: usize,
        k: usize,
        t: ElemType,
        out_t: ElemType,
        accumulate: bool,
        x: &[f32],
        w: &[f32],
        out0: &[f32],
    ) -> Vec<f32>;
}

impl<D: Device> DeviceLike for D {
    fn product(
        &self,
        m: usize,
        n: usize,
        k: usize,
        t: ElemType,
        out_t: ElemType,
        accumulate: bool,
        x: &[f32],
        w: &[f32],
        out0: &[f32],
    ) -> Vec<f32> {
        let upload = |v: &[f32], t: ElemType| {
            let p = self.alloc(v.len() * t.size()).unwrap();
            match t {
                ElemType::F32 => self.htod_slice(v, p).unwrap(),
                ElemType::BF16 => self.htod_slice(&to_bf16_bits(v), p).unwrap(),
            }
            p
        };
        let (xp, wp, op) = (upload(x, t), upload(w, t), upload(out0, out_t));
        self.gemm(&Gemm {
            m,
            n,
            k,
            x: xp,
            x_type: t,
            ldx: k,
            w: wp,
            w_type: t,
            ldw: k,
            out: op,
            out_type: out_t,
            ldout: n,
            accumulate,
        })
        .unwrap();
        let out = match out_t {
            ElemType::F32 => self.dtoh_vec::<f32>(op, m * n).unwrap(),
            ElemType::BF16 => self
                .dtoh_vec::<u16>(op, m * n)
                .unwrap()
                .into_iter()
                .map(|b| bf16::from_bits(b).to_f32())
                .collect(),
        };
        for p in [xp, wp, op] {
            self.free(p);
        }
        out
    }
}

#[test]
fn a_captured_graph_replays_with_the_buffers_current_contents() {
    let Some(dev) = device() else { return };
    let n = 300usize;
    let add = dev.function("add_f32").unwrap();
    let (acc, delta) = (dev.alloc(n * 4).unwrap(), dev.alloc(n * 4).unwrap());
    dev.htod_slice(&vec![0.0f32; n], acc).unwrap();
    dev.htod_slice(&vec![1.0f32; n], delta).unwrap();
    dev.begin_capture().unwrap();
    // Copies from the host are refused while capturing (a graph cannot hold pageable data).
    assert!(dev.htod_slice(&[0.0f32], delta).is_err());
    for _ in 0..3 {
        dev.launch(
            add,
            &LaunchConfig::linear(2, 256),
            &[acc.into(), delta.into(), Arg::U64(n as u64)],
        )
        .unwrap();
    }
    let graph = dev.end_capture().unwrap();
    // Recorded, not run.
    assert_eq!(dev.dtoh_vec::<f32>(acc, n).unwrap(), vec![0.0; n]);
    dev.replay(&graph).unwrap();
    dev.htod_slice(&vec![2.0f32; n], delta).unwrap();
    dev.replay(&graph).unwrap();
    assert_eq!(dev.dtoh_vec::<f32>(acc, n).unwrap(), vec![9.0; n]);
    drop(graph);
    dev.free(acc);
    dev.free(delta);
}

#[test]
fn many_staged_copies_wrap_the_ring_and_all_arrive() {
    let Some(dev) = device() else { return };
    // 80 MiB in 32 KiB pieces: more than the 64 MiB staging ring holds, so it wraps (after a
    // synchronization) while copies are queued. A slot reused before its copy ran would be a
    // host write to pinned memory the fake driver reports.
    let piece = 8192usize;
    let pieces = 2560usize;
    let buf = dev.alloc(piece * pieces * 4).unwrap();
    for i in 0..pieces {
        let v: Vec<f32> = (0..piece).map(|j| (i * piece + j) as f32).collect();
        dev.htod_slice(&v, buf.offset(i * piece * 4)).unwrap();
    }
    let all = dev.dtoh_vec::<f32>(buf, piece * pieces).unwrap();
    assert!(all.iter().enumerate().all(|(i, &v)| v == i as f32));
    dev.free(buf);
}

#[test]
fn a_step_sized_upload_does_not_wait_for_the_device() {
    if device().is_none() {
        return;
    }
    // In a process of its own: the synchronization count is the process's.
    let (stdout, stderr) = run_child("step_upload");
    assert!(
        stdout.contains("child result: 0"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}

#[test]
fn memory_info_counts_allocations_and_the_context() {
    if device().is_none() {
        return;
    }
    // In a process of its own: the other tests allocate on the shared device meanwhile.
    let (stdout, stderr) = run_child("meminfo");
    assert!(
        stdout.contains("child result: 0"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}

fn mem_info() -> (usize, usize) {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the device's context is current on this thread after any call of it.
    unsafe { drv_sys::cuMemGetInfo_v2(&mut free, &mut total) }
        .result()
        .unwrap();
    (free, total)
}

/// A kernel of test_kernels/ loaded through the raw driver API (the device's own modules hold
/// only kernels/).
fn test_function(dev: &CudaDevice, name: &str) -> (drv_sys::CUfunction, drv_sys::CUmodule) {
    let file = if name.starts_with("fake_") {
        "emu_fake.cu"
    } else {
        "emu_errors.cu"
    };
    let path = format!("{}/test_kernels/{file}", env!("CARGO_MANIFEST_DIR"));
    let text: &'static str = Box::leak(std::fs::read_to_string(&path).unwrap().into_boxed_str());
    let source = KernelSource {
        name: Box::leak(file.to_string().into_boxed_str()),
        text,
    };
    let nvrtc = Nvrtc::load().unwrap();
    let options = vec![
        "--gpu-architecture=sm_90".to_string(),
        "-std=c++17".to_string(),
    ];
    let compiled = nvrtc
        .compile(&source, kernels::HEADERS, Arch::SM90, &options)
        .unwrap();
    dev.synchronize().unwrap(); // makes the device's context current on this thread
    // SAFETY: the context is current; the image is a whole CUBIN, copied by the call.
    let module = unsafe { drv::module::load_data(compiled.cubin.as_ptr().cast()) }.unwrap();
    // SAFETY: the module was just loaded.
    let f = unsafe { drv::module::get_function(module, std::ffi::CString::new(name).unwrap()) }
        .unwrap();
    (f, module)
}

/// Launches `f` with `args` (each an 8-byte slot) on the NULL stream.
fn raw_launch(
    f: drv_sys::CUfunction,
    grid: u32,
    block: u32,
    shared: u32,
    args: &mut [u64],
) -> Result<(), CUresult> {
    let mut ptrs: Vec<*mut std::ffi::c_void> =
        args.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    // SAFETY: the callers pass the kernel's parameters in its order; memory errors are what
    // some cases test, and the fake driver reports them.
    unsafe {
        drv::launch_kernel(
            f,
            (grid, 1, 1),
            (block, 1, 1),
            shared,
            std::ptr::null_mut(),
            &mut ptrs,
        )
    }
    .map_err(|e| e.0)
}

fn sync() -> Result<(), CUresult> {
    // SAFETY: a context is current (the callers used the device on this thread).
    unsafe { drv_sys::cuCtxSynchronize() }
        .result()
        .map_err(|e| e.0)
}

#[test]
fn launches_over_the_limits_are_refused_with_the_drivers_codes() {
    let Some(dev) = device() else { return };
    let y = dev.alloc(4096 * 4).unwrap();
    let (bounded, _m) = test_function(&dev, "fake_bounded");
    assert_eq!(raw_launch(bounded, 1, 128, 0, &mut [y.0]), Ok(()));
    // More threads than __launch_bounds__(128) allows.
    assert_eq!(
        raw_launch(bounded, 1, 256, 0, &mut [y.0]),
        Err(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    );
    // More than a block may have.
    assert_eq!(
        raw_launch(bounded, 1, 2048, 0, &mut [y.0]),
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    // Dynamic shared memory over 48 KiB without the opt-in, and an opt-in over what the
    // static 32 KiB leave of 227 KiB.
    let (shared, _m2) = test_function(&dev, "fake_static_shared");
    assert_eq!(
        raw_launch(shared, 1, 64, 20 << 10, &mut [y.0]),
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    let set = |bytes: i32| {
        // SAFETY: a live function of a loaded module.
        unsafe {
            drv::function::set_function_attribute(
                shared,
                drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        }
        .map_err(|e| e.0)
    };
    assert_eq!(set(200 << 10), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    assert_eq!(set(190 << 10), Ok(()));
    assert_eq!(raw_launch(shared, 1, 64, 190 << 10, &mut [y.0]), Ok(()));
    assert_eq!(sync(), Ok(()));
    let got = dev.dtoh_vec::<f32>(y, 64).unwrap();
    assert_eq!(got, (0..64).rev().map(|i| i as f32).collect::<Vec<_>>());
    dev.free(y);
}

#[test]
fn faults_are_sticky_errors_with_the_drivers_codes() {
    if device().is_none() {
        return;
    }
    for (case, code, says) in [
        ("misaligned", 716, "misaligned vector access"),
        ("oob", 700, "outside every live allocation"),
        ("trap", 719, "trap"),
        ("use_after_free", 700, "outside every live allocation"),
        ("pinned_race", 719, "before the copy ran"),
        (
            "capture_alloc",
            901,
            "cuMemAlloc was called while capturing",
        ),
    ] {
        let (stdout, stderr) = run_child(case);
        assert!(
            stdout.contains(&format!("child result: {code}")),
            "{case}: expected error {code}\nstdout: {stdout}\nstderr: {stderr}"
        );
        assert!(
            stderr.contains(says),
            "{case}: stderr lacks {says:?}: {stderr}"
        );
    }
}

fn run_child(case: &str) -> (String, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fault_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LMI_FAKE_CHILD", case)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "run by the tests above, in a child process"]
fn fault_child() {
    let Ok(case) = std::env::var("LMI_FAKE_CHILD") else {
        return;
    };
    let dev = device().expect("the fake driver");
    let x = dev.alloc(64 * 4).unwrap();
    let y = dev.alloc(64 * 4).unwrap();
    let result: Result<(), CUresult> = match case.as_str() {
        "meminfo" => {
            dev.synchronize().unwrap();
            let (free0, total) = mem_info();
            assert_eq!(total, dev.info().total_memory);
            assert!(free0 < total, "the context takes its share");
            let p = dev.alloc(64 << 20).unwrap();
            let (free1, _) = mem_info();
            assert_eq!(free0 - free1, 64 << 20);
            dev.free(p);
            dev.synchronize().unwrap();
            // Freed memory stays in the pool (CudaDevice sets no release threshold).
            assert_eq!(mem_info().0, free1);
            Ok(())
        }
        "step_upload" => {
            // A batch-256 step's grammar masks for a 128k vocabulary (4 MiB) and block tables:
            // staged and queued, never waited for; the download after them waits once.
            let masks = vec![0x5555_5555u32; 256 * 4096];
            let tables = vec![7u32; 256 * 2048];
            let (m, t) = (
                dev.alloc(masks.len() * 4).unwrap(),
                dev.alloc(tables.len() * 4).unwrap(),
            );
            dev.synchronize().unwrap();
            let before = fake::synchronizations().expect("the fake driver is loaded");
            dev.htod_slice(&masks, m).unwrap();
            dev.htod_slice(&tables, t).unwrap();
            assert_eq!(fake::synchronizations(), Some(before), "an upload waited");
            assert_eq!(dev.dtoh_vec::<u32>(t, tables.len()).unwrap(), tables);
            assert_eq!(fake::synchronizations(), Some(before + 1));
            assert_eq!(dev.dtoh_vec::<u32>(m, masks.len()).unwrap(), masks);
            Ok(())
        }
        "misaligned" => {
            let (f, _m) = test_function(&dev, "emu_misaligned");
            raw_launch(f, 1, 1, 0, &mut [x.0, y.0]).and_then(|()| sync())
        }
        "oob" => {
            let (f, _m) = test_function(&dev, "emu_read_fault");
            raw_launch(f, 2, 64, 0, &mut [x.0, y.0, 100]).and_then(|()| sync())
        }
        "trap" => {
            let (f, _m) = test_function(&dev, "emu_trap");
            raw_launch(f, 1, 8, 0, &mut [y.0]).and_then(|()| sync())
        }
        "use_after_free" => {
            // Freed in stream order, then used by a later launch on the same stream.
            let f = dev.function("add_f32").unwrap();
            let z = dev.alloc(64 * 4).unwrap();
            dev.free(z);
            // Once the free has run, mappings made elsewhere in the process (the emulator
            // maps its threads' stacks as kernels launch) must not land on the freed range,
            // or the use below would read live memory instead of faulting (it did, now and
            // then, until freed ranges were kept reserved).
            dev.synchronize().unwrap();
            let page = 4096usize;
            let freed = (z.0 as usize & !(page - 1))..(z.0 as usize + 64 * 4);
            let probes: Vec<*mut libc::c_void> = (0..64)
                .map(|_| {
                    // SAFETY: an anonymous private mapping, unmapped below.
                    unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            2 * page,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        )
                    }
                })
                .collect();
            for &p in &probes {
                let r = p as usize..p as usize + 2 * page;
                assert!(
                    r.end <= freed.start || r.start >= freed.end,
                    "a new mapping at {r:x?} reuses the freed allocation {freed:x?}"
                );
                // SAFETY: mapped above, not used since.
                unsafe { libc::munmap(p, 2 * page) };
            }
            let r = dev.launch(
                f,
                &LaunchConfig::linear(1, 64),
                &[z.into(), y.into(), Arg::U64(64)],
            );
            assert!(r.is_ok(), "the launch itself is accepted: {r:?}");
            sync()
        }
        "pinned_race" => {
            let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: plain driver calls on this thread's current context; `host` is 256
            // bytes of page-locked memory, written through a slice of that length.
            unsafe {
                drv_sys::cuMemHostAlloc(&mut host, 256, 0).result().unwrap();
                let bytes = std::slice::from_raw_parts_mut(host.cast::<u8>(), 256);
                bytes.fill(1);
                drv_sys::cuMemcpyHtoDAsync_v2(x.0, host, 256, std::ptr::null_mut())
                    .result()
                    .unwrap();
                bytes.fill(2); // too early: the copy has not run
            }
            sync()
        }
        "capture_alloc" => {
            dev.begin_capture().unwrap();
            let mut p = 0u64;
            // SAFETY: a plain allocation call; it is refused during capture.
            let r = unsafe { drv_sys::cuMemAlloc_v2(&mut p, 256) };
            assert_eq!(r, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            match dev.end_capture() {
                Ok(_) => Ok(()),
                Err(e) => {
                    println!("end_capture: {e}");
                    Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
                }
            }
        }
        other => panic!("unknown case {other}"),
    };
    let code = result.err().map_or(0, |c| c as i32);
    println!("child result: {code}");
    if code != 0 && case != "capture_alloc" {
        // Sticky: every later call gets the same error.
        let again = sync().err().map_or(0, |c| c as i32);
        assert_eq!(again, code, "the error is sticky");
        let alloc = dev.alloc(16).map(|_| ());
        assert!(alloc.is_err(), "an allocation after a fault fails too");
    }
}
