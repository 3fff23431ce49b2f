//! Wrong kernels and wrong launches are reported, never hang: divergent barriers, warp masks
//! naming exited lanes, argument size mismatches, __trap, writes past an allocation's end, and
//! (in a child process) faults, whose report names the kernel, block, thread and address.

use std::process::Command;

use lmi_cuda::{Arg, Device, DeviceExt, LaunchConfig};
use lmi_cuda_emu::{EmuDevice, ThreadOrder};

fn launch_err(d: &EmuDevice, name: &str, cfg: LaunchConfig, args: &[Arg]) -> String {
    let f = d.function(name).unwrap();
    d.launch(f, &cfg, args).unwrap_err().to_string()
}

#[test]
fn syncthreads_in_divergent_code_is_an_error_not_a_hang() {
    let d = EmuDevice::new();
    let out = d.alloc(64 * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        let err = launch_err(
            &d,
            "emu_divergent_sync",
            LaunchConfig::linear(1, 64),
            &[out.into()],
        );
        assert!(err.contains("emu_divergent_sync"), "{err}");
        assert!(err.contains("deadlock"), "{err}");
        assert!(
            err.contains("threads 0-15 wait at __syncthreads() [emu_errors.cu:"),
            "{err}"
        );
        assert!(
            err.contains("wait at __shfl_xor_sync(mask 0xffffffff) [common.cuh:"),
            "{err}"
        );
        println!("{order:?}: {err}");
    }
}

#[test]
fn different_syncthreads_reached_by_different_threads_are_an_error() {
    let d = EmuDevice::new();
    let out = d.alloc(64 * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        let err = launch_err(
            &d,
            "emu_split_sync",
            LaunchConfig::linear(1, 64),
            &[out.into()],
        );
        assert!(err.contains("divergent barriers"), "{err}");
        println!("{order:?}: {err}");
    }
}

#[test]
fn a_mask_naming_an_exited_lane_is_an_error() {
    let d = EmuDevice::new();
    let out = d.alloc(32 * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        let err = launch_err(
            &d,
            "emu_exited_lane",
            LaunchConfig::linear(1, 32),
            &[out.into()],
        );
        assert!(
            err.contains("emu_exited_lane") && err.contains("exited"),
            "{err}"
        );
        println!("{order:?}: {err}");
    }
    // a warp of 16 threads: the full mask names lanes that do not exist
    let err = launch_err(
        &d,
        "emu_exited_lane",
        LaunchConfig::linear(1, 16),
        &[out.into()],
    );
    assert!(err.contains("do not exist"), "{err}");
}

#[test]
fn argument_count_and_size_mismatches_are_reported() {
    let d = EmuDevice::new();
    let x = d.alloc(4).unwrap();
    let y = d.alloc(4).unwrap();
    d.htod_slice(&[2.0f32], x).unwrap();
    let cfg = LaunchConfig::linear(1, 1);
    // n is a u64: a u32 is the wrong size
    let err = launch_err(
        &d,
        "emu_signature",
        cfg,
        &[x.into(), Arg::U32(3), Arg::F64(0.5), Arg::U32(1), y.into()],
    );
    assert!(
        err.contains("emu_signature") && err.contains("parameter 1"),
        "{err}"
    );
    assert!(
        err.contains("8 bytes") && err.contains("is 4 bytes"),
        "{err}"
    );
    let err = launch_err(&d, "emu_signature", cfg, &[x.into()]);
    assert!(
        err.contains("1 arguments given, the kernel takes 5"),
        "{err}"
    );
    // a pointer outside every allocation
    let err = launch_err(
        &d,
        "emu_signature",
        cfg,
        &[
            Arg::Ptr(lmi_cuda::DevPtr(0x1000)),
            Arg::U64(3),
            Arg::F64(0.5),
            Arg::U32(1),
            y.into(),
        ],
    );
    assert!(
        err.contains("argument 0") && err.contains("not inside any live allocation"),
        "{err}"
    );
    let f = d.function("emu_signature").unwrap();
    d.launch(
        f,
        &cfg,
        &[x.into(), Arg::U64(3), Arg::F64(0.5), Arg::U32(1), y.into()],
    )
    .unwrap();
    assert_eq!(d.dtoh_vec::<f32>(y, 1).unwrap(), vec![5.0]);
}

#[test]
fn invalid_launch_configurations_are_reported() {
    let d = EmuDevice::new();
    let out = d.alloc(4096).unwrap();
    let err = launch_err(
        &d,
        "emu_builtins",
        LaunchConfig::linear(1, 1025),
        &[out.into()],
    );
    assert!(err.contains("exceeds the limits"), "{err}");
    let err = launch_err(
        &d,
        "emu_builtins",
        LaunchConfig::linear(0, 32),
        &[out.into()],
    );
    assert!(err.contains("non-zero"), "{err}");
}

#[test]
fn trap_ends_the_launch_with_an_error() {
    let d = EmuDevice::new();
    let out = d.alloc(32 * 4).unwrap();
    let err = launch_err(&d, "emu_trap", LaunchConfig::linear(1, 32), &[out.into()]);
    assert!(
        err.contains("thread 3: __trap() at emu_errors.cu:"),
        "{err}"
    );
    // the device is still usable afterwards
    let ok = d.function("emu_early_exit").unwrap();
    d.launch(
        ok,
        &LaunchConfig::linear(1, 64),
        &[d.alloc(64 * 4).unwrap().into()],
    )
    .unwrap();
}

#[test]
fn a_write_into_the_slack_past_an_allocation_is_reported() {
    let d = EmuDevice::new();
    // 10 floats: the allocation is 256-byte aligned, so 216 poisoned bytes follow it
    let y = d.alloc(40).unwrap();
    let err = launch_err(
        &d,
        "emu_write_past_end",
        LaunchConfig::linear(1, 11),
        &[y.into(), 10u32.into()],
    );
    assert!(
        err.contains("emu_write_past_end") && err.contains("wrote past the end"),
        "{err}"
    );
    assert!(err.contains("bytes 40..=43"), "{err}");
    println!("{err}");
}

/// Runs this test binary's `child` test in a child process with `LMI_EMU_CHILD=case`, and
/// returns its stderr (the child is expected to die).
fn run_child(case: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fault_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LMI_EMU_CHILD", case)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "the child was expected to die: {err}"
    );
    err
}

#[test]
#[ignore = "run by the fault tests in a child process"]
fn fault_child() {
    let Ok(case) = std::env::var("LMI_EMU_CHILD") else {
        return;
    };
    let d = EmuDevice::new();
    let x = d.alloc(64 * 4).unwrap();
    let y = d.alloc(64 * 4).unwrap();
    let r = match case.as_str() {
        "oob" => {
            let f = d.function("emu_read_fault").unwrap();
            d.launch(
                f,
                &LaunchConfig::linear(2, 64),
                &[x.into(), y.into(), Arg::U32(100)],
            )
        }
        "misaligned" => {
            let f = d.function("emu_misaligned").unwrap();
            d.launch(f, &LaunchConfig::linear(1, 1), &[x.into(), y.into()])
        }
        "stack" => {
            let f = d.function("emu_stack_overflow").unwrap();
            d.launch(
                f,
                &LaunchConfig::linear(1, 2),
                &[y.into(), Arg::I32(100_000)],
            )
        }
        "shared_overrun" => {
            let f = d.function("emu_shared_overrun").unwrap();
            d.launch(f, &LaunchConfig::linear(1, 32), &[y.into(), Arg::U32(1)])
        }
        _ => Ok(()),
    };
    eprintln!("child survived: {r:?}");
}

#[test]
fn an_out_of_bounds_read_aborts_naming_kernel_block_thread_and_address() {
    let err = run_child("oob");
    assert!(
        err.contains("SIGSEGV in kernel `emu_read_fault` (emu_errors.cu)"),
        "{err}"
    );
    assert!(err.contains("block (1,0,0) of grid (2,1,1)"), "{err}");
    assert!(err.contains("thread 5 = threadIdx (5,0,0)"), "{err}");
    assert!(err.contains("outside every live allocation"), "{err}");
    assert!(err.contains("[2] unsigned int = 0x64"), "{err}");
    println!("{err}");
}

#[test]
fn a_misaligned_vector_load_aborts_with_a_hint() {
    let err = run_child("misaligned");
    assert!(err.contains("kernel `emu_misaligned`"), "{err}");
    assert!(err.contains("misaligned vector access"), "{err}");
    println!("{err}");
}

#[test]
fn a_fiber_stack_overflow_is_named() {
    let err = run_child("stack");
    assert!(err.contains("kernel `emu_stack_overflow`"), "{err}");
    assert!(
        err.contains("stack overflow") && err.contains("LMI_EMU_STACK_KB"),
        "{err}"
    );
    println!("{err}");
}

#[test]
fn a_static_shared_overrun_is_caught_in_the_sanitized_build() {
    if !lmi_cuda_emu::SANITIZED {
        return; // only AddressSanitizer's redzones see it
    }
    let err = run_child("shared_overrun");
    assert!(
        err.contains("AddressSanitizer") && err.contains("global-buffer-overflow"),
        "{err}"
    );
    println!("{err}");
}
