//! EmuDevice's memory, graphs and matrix product.

use half::bf16;
use lmi_cuda::{Arg, DevPtr, Device, DeviceExt, ElemType, Gemm, LaunchConfig};
use lmi_cuda_emu::EmuDevice;

#[test]
fn device_info_says_emulated_hopper() {
    let d = EmuDevice::new();
    let i = d.info();
    assert_eq!(i.name, "emulated (CPU)");
    assert_eq!(i.compute_capability, (9, 0));
    assert_eq!(i.multiprocessors, 132);
    assert_eq!(i.max_shared_mem_per_block, 227 * 1024);
    assert!(i.emulated);
}

#[test]
fn allocations_are_poisoned_aligned_and_zeroable() {
    let d = EmuDevice::new();
    for bytes in [1usize, 40, 256, 4096, 100_000] {
        let p = d.alloc(bytes).unwrap();
        assert_eq!(p.0 % 256, 0, "256-byte aligned start");
        let v: Vec<u8> = d.dtoh_vec(p, bytes).unwrap();
        assert!(v.iter().all(|&b| b == 0xff), "poisoned with 0xFF");
        d.memset_zero(p, bytes).unwrap();
        assert!(d.dtoh_vec::<u8>(p, bytes).unwrap().iter().all(|&b| b == 0));
        d.free(p);
    }
    // poison reads as NaN in f32 and bf16
    let p = d.alloc(8).unwrap();
    assert!(d.dtoh_vec::<f32>(p, 2).unwrap().iter().all(|v| v.is_nan()));
    assert!(
        d.dtoh_vec::<u16>(p, 4)
            .unwrap()
            .iter()
            .all(|&v| bf16::from_bits(v).is_nan())
    );
    assert_eq!(d.memory_in_use(), 8);
}

#[test]
fn copies_outside_an_allocation_are_errors() {
    let d = EmuDevice::new();
    let a = d.alloc(100).unwrap();
    let b = d.alloc(100).unwrap();
    let err = d.htod(&[0u8; 101], a).unwrap_err().to_string();
    assert!(err.contains("htod") && err.contains("101 bytes"), "{err}");
    assert!(d.htod(&[0u8; 10], a.offset(95)).is_err());
    assert!(d.dtoh(a.offset(50), &mut [0u8; 51]).is_err());
    assert!(d.dtod(a, b.offset(1), 100).is_err());
    assert!(d.memset_zero(b, 101).is_err());
    assert!(d.htod(&[1u8; 4], DevPtr(0x1000)).is_err());
    // in-bounds copies work, device to device included
    d.htod(&[7u8; 100], a).unwrap();
    d.dtod(a, b, 100).unwrap();
    assert_eq!(d.dtoh_vec::<u8>(b, 100).unwrap(), vec![7u8; 100]);
    // freed memory is no longer accepted
    d.free(a);
    let err = d.dtoh(a, &mut [0u8; 4]).unwrap_err().to_string();
    assert!(err.contains("freed, or never allocated"), "{err}");
}

#[test]
#[should_panic(expected = "not the start of a live allocation")]
fn a_double_free_panics() {
    let d = EmuDevice::new();
    let a = d.alloc(16).unwrap();
    d.free(a);
    d.free(a);
}

#[test]
fn graph_capture_records_without_running_and_replays_with_current_data() {
    let d = EmuDevice::new();
    let n = 256usize;
    let x = d.alloc(n * 4).unwrap();
    let y = d.alloc(n * 4).unwrap();
    let z = d.alloc(n * 4).unwrap();
    let f = d.function("emu_reverse_static").unwrap();
    let input1: Vec<f32> = (0..n).map(|i| i as f32).collect();
    d.htod_slice(&input1, x).unwrap();
    d.memset_zero(y, n * 4).unwrap();
    d.memset_zero(z, n * 4).unwrap();

    let launches = d.launch_count();
    d.begin_capture().unwrap();
    d.memset_zero(z, n * 4).unwrap();
    d.launch(f, &LaunchConfig::linear(1, n as u32), &[x.into(), y.into()])
        .unwrap();
    d.dtod(y, z, n * 4).unwrap();
    // host copies, allocation and synchronize are refused while capturing
    assert!(d.htod(&[0u8; 4], x).is_err());
    assert!(d.alloc(4).is_err());
    assert!(d.synchronize().is_err());
    assert!(d.dtoh(x, &mut [0u8; 4]).is_err());
    // ... and invalidate the capture, as CUDA does
    assert!(d.end_capture().is_err());

    d.begin_capture().unwrap();
    d.memset_zero(z, n * 4).unwrap();
    d.launch(f, &LaunchConfig::linear(1, n as u32), &[x.into(), y.into()])
        .unwrap();
    d.dtod(y, z, n * 4).unwrap();
    let graph = d.end_capture().unwrap();
    assert_eq!((graph.len(), graph.launches()), (3, 1));
    assert_eq!(d.launch_count(), launches, "nothing ran during capture");
    assert!(
        d.dtoh_vec::<f32>(z, n).unwrap().iter().all(|&v| v == 0.0),
        "nothing ran"
    );
    assert!(
        d.dtoh_vec::<f32>(y, n).unwrap().iter().all(|&v| v == 0.0),
        "nothing ran"
    );

    d.replay(&graph).unwrap();
    let want1: Vec<f32> = input1.iter().rev().cloned().collect();
    assert_eq!(d.dtoh_vec::<f32>(z, n).unwrap(), want1);
    // new data in the same buffers: the replay reads it
    let input2: Vec<f32> = (0..n).map(|i| (i * i) as f32).collect();
    d.htod_slice(&input2, x).unwrap();
    d.replay(&graph).unwrap();
    let want2: Vec<f32> = input2.iter().rev().cloned().collect();
    assert_eq!(d.dtoh_vec::<f32>(z, n).unwrap(), want2);
    assert_eq!(d.launch_count(), launches + 2);

    // a graph is bound to its device; a launch error in a replay names the operation
    assert!(EmuDevice::new().replay(&graph).is_err());
    d.free(y);
    let err = d.replay(&graph).unwrap_err().to_string();
    assert!(err.contains("replay, operation"), "{err}");
}

#[test]
fn captured_launches_are_checked_when_recorded() {
    let d = EmuDevice::new();
    let x = d.alloc(16).unwrap();
    let f = d.function("emu_reverse_static").unwrap();
    d.begin_capture().unwrap();
    let err = d
        .launch(f, &LaunchConfig::linear(1, 4), &[x.into(), Arg::U32(1)])
        .unwrap_err();
    assert!(err.to_string().contains("parameter 1"), "{err}");
    assert!(d.end_capture().unwrap().is_empty());
}

/// Writes `v` (f32) as `t` into a fresh allocation, element `i` at `i`.
fn upload(d: &EmuDevice, v: &[f32], t: ElemType) -> DevPtr {
    match t {
        ElemType::F32 => {
            let p = d.alloc(v.len() * 4).unwrap();
            d.htod_slice(v, p).unwrap();
            p
        }
        ElemType::BF16 => {
            let bits: Vec<u16> = v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
            let p = d.alloc(v.len() * 2).unwrap();
            d.htod_slice(&bits, p).unwrap();
            p
        }
    }
}

fn download(d: &EmuDevice, p: DevPtr, len: usize, t: ElemType) -> Vec<f32> {
    match t {
        ElemType::F32 => d.dtoh_vec(p, len).unwrap(),
        ElemType::BF16 => d
            .dtoh_vec::<u16>(p, len)
            .unwrap()
            .into_iter()
            .map(|b| bf16::from_bits(b).to_f32())
            .collect(),
    }
}

/// Values exactly representable in bf16.
fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 37 + seed * 11) % 29) as f32 / 8.0 - 1.75)
        .collect()
}

#[test]
fn gemm_matches_a_f64_reference_with_strides_types_and_accumulate() {
    let d = EmuDevice::new();
    let (m, n, k) = (5usize, 7usize, 33usize);
    let (ldx, ldw, ldout) = (k + 3, k + 1, n + 2);
    for x_type in [ElemType::F32, ElemType::BF16] {
        for w_type in [ElemType::F32, ElemType::BF16] {
            for out_type in [ElemType::F32, ElemType::BF16] {
                for accumulate in [false, true] {
                    let xv = values(m * ldx, 1);
                    let wv = values(n * ldw, 2);
                    let ov = values(m * ldout, 3);
                    let (xp, wp, op) = (
                        upload(&d, &xv, x_type),
                        upload(&d, &wv, w_type),
                        upload(&d, &ov, out_type),
                    );
                    let g = Gemm {
                        m,
                        n,
                        k,
                        x: xp,
                        x_type,
                        ldx,
                        w: wp,
                        w_type,
                        ldw,
                        out: op,
                        out_type,
                        ldout,
                        accumulate,
                    };
                    d.gemm(&g).unwrap();
                    let got = download(&d, op, m * ldout, out_type);
                    for i in 0..m {
                        for j in 0..ldout {
                            let at = i * ldout + j;
                            if j >= n {
                                assert_eq!(got[at], ov[at], "columns past n are untouched");
                                continue;
                            }
                            let mut r: f64 = (0..k)
                                .map(|c| xv[i * ldx + c] as f64 * wv[j * ldw + c] as f64)
                                .sum();
                            if accumulate {
                                r += ov[at] as f64;
                            }
                            let want = match out_type {
                                ElemType::F32 => r as f32,
                                ElemType::BF16 => bf16::from_f32(r as f32).to_f32(),
                            };
                            let tol = match out_type {
                                ElemType::F32 => 1e-5 * (1.0 + r.abs()) as f32,
                                ElemType::BF16 => want.abs() / 128.0 + 1e-6,
                            };
                            assert!(
                                (got[at] - want).abs() <= tol,
                                "{x_type:?}/{w_type:?}->{out_type:?} acc {accumulate} [{i},{j}]: {} vs {want}",
                                got[at]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gemm_rounds_bf16_output_to_nearest_even_and_checks_ranges() {
    let d = EmuDevice::new();
    // 1 + 2^-8 is halfway between two bf16 values: nearest even is 1.0; 1 + 3*2^-8 rounds up.
    let x = upload(&d, &[1.0, 1.0], ElemType::F32);
    let w = upload(&d, &[1.0, 1.0 / 256.0, 1.0, 3.0 / 256.0], ElemType::F32);
    let out = d.alloc(4).unwrap();
    let mut g = Gemm {
        m: 1,
        n: 2,
        k: 2,
        x,
        x_type: ElemType::F32,
        ldx: 2,
        w,
        w_type: ElemType::F32,
        ldw: 2,
        out,
        out_type: ElemType::BF16,
        ldout: 2,
        accumulate: false,
    };
    d.gemm(&g).unwrap();
    let o = download(&d, out, 2, ElemType::BF16);
    assert_eq!(o, vec![1.0, 1.0 + 4.0 / 256.0]);
    let (k, ldx, ldw) = (g.k, g.ldx, g.ldw);
    (g.k, g.ldx, g.ldw) = (3, 3, 3); // x has only 2 elements
    assert!(d.gemm(&g).unwrap_err().to_string().contains("gemm x"));
    g.m = 2; // out has one row
    assert!(d.gemm(&g).unwrap_err().to_string().contains("gemm out"));
    (g.m, g.k, g.ldx, g.ldw) = (1, k, ldx, ldw);
    g.ldout = 1;
    assert!(d.gemm(&g).is_err(), "ldout < n");
}
