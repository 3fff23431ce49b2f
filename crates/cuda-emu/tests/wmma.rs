//! nvcuda::wmma on the emulator (emu/wmma.h, test_kernels/emu_wmma.cu): products against a host
//! reference for every shape and layout, elementwise work on fragments, a layout that is not the
//! hardware's, and the warp-collective rules (divergent calls, misaligned pointers, bad `ldm`,
//! partial warps) reported as launch errors.

use half::bf16;
use lmi_cuda::device::Pod;
use lmi_cuda::{Arg, DevPtr, Device, DeviceExt, LaunchConfig};
use lmi_cuda_emu::{EmuDevice, ThreadOrder};

fn upload<T: Pod>(d: &EmuDevice, v: &[T]) -> DevPtr {
    let p = d.alloc(std::mem::size_of_val(v)).unwrap();
    d.htod_slice(v, p).unwrap();
    p
}

fn launch(d: &EmuDevice, name: &str, threads: u32, args: &[Arg]) -> Result<(), String> {
    let f = d.function(name).unwrap();
    d.launch(f, &LaunchConfig::linear(1, threads), args)
        .map_err(|e| e.to_string())
}

/// Deterministic values in [-scale, scale), already bf16.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            bf16::from_f32(v).to_f32()
        })
        .collect()
}

/// A rows × cols matrix stored with leading dimension `ld`, row- or column-major.
#[derive(Clone, Copy)]
struct Mat {
    rows: usize,
    cols: usize,
    ld: usize,
    col_major: bool,
}

impl Mat {
    fn at(&self, r: usize, c: usize) -> usize {
        if self.col_major {
            c * self.ld + r
        } else {
            r * self.ld + c
        }
    }

    /// Elements one matrix spans, rounded up to 32 bytes of `elem`-byte values.
    fn footprint(&self, elem: usize) -> usize {
        let n = if self.col_major { self.cols } else { self.rows } * self.ld;
        n.div_ceil(32 / elem) * (32 / elem)
    }
}

/// Runs one product per warp for `shape` (m, n, k) and `layouts` (emu_wmma_product's bits) and
/// checks every warp's D against the host: bit for bit against the emulator's documented order
/// (c, then k ascending, in f32), and within 1e-5 of an f64 reference.
fn check_product(d: &EmuDevice, shape: u32, (m, n, k): (usize, usize, usize), layouts: u32) {
    const WARPS: usize = 2;
    let col = |bit: u32| layouts >> bit & 1 == 1;
    // Leading dimensions larger than the matrices: strides are honoured.
    let a = Mat {
        rows: m,
        cols: k,
        ld: if col(0) { m } else { k } + 8,
        col_major: col(0),
    };
    let b = Mat {
        rows: k,
        cols: n,
        ld: if col(1) { k } else { n } + 16,
        col_major: col(1),
    };
    let c = Mat {
        rows: m,
        cols: n,
        ld: if col(2) { m } else { n } + 4,
        col_major: col(2),
    };
    let o = Mat {
        rows: m,
        cols: n,
        ld: if col(3) { m } else { n } + 12,
        col_major: col(3),
    };
    let (sa, sb, sc, so) = (
        a.footprint(2),
        b.footprint(2),
        c.footprint(4),
        o.footprint(4),
    );
    let av = values(WARPS * sa, 1 + shape as u64, 2.0);
    let bv = values(WARPS * sb, 7 + layouts as u64, 2.0);
    let cv = values(WARPS * sc, 11, 8.0);
    let a_bits: Vec<u16> = av.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let b_bits: Vec<u16> = bv.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let (pa, pb, pc) = (upload(d, &a_bits), upload(d, &b_bits), upload(d, &cv));
    let pd = d.alloc(WARPS * so * 4).unwrap();
    let u = |v: usize| Arg::U32(v as u32);
    launch(
        d,
        "emu_wmma_product",
        32 * WARPS as u32,
        &[
            pa.into(),
            pb.into(),
            pc.into(),
            pd.into(),
            Arg::U32(shape),
            Arg::U32(layouts),
            u(a.ld),
            u(b.ld),
            u(c.ld),
            u(o.ld),
            u(sa),
            u(sb),
            u(sc),
            u(so),
        ],
    )
    .unwrap();
    let got: Vec<f32> = d.dtoh_vec(pd, WARPS * so).unwrap();
    for w in 0..WARPS {
        let (ao, bo, co, oo) = (w * sa, w * sb, w * sc, w * so);
        for r in 0..m {
            for j in 0..n {
                let mut exact = cv[co + c.at(r, j)];
                let mut wide = exact as f64;
                for kk in 0..k {
                    let p = av[ao + a.at(r, kk)] * bv[bo + b.at(kk, j)];
                    exact += p;
                    wide += p as f64;
                }
                let g = got[oo + o.at(r, j)];
                let what = format!("shape {shape}, layouts {layouts:04b}, warp {w}, d[{r}][{j}]");
                assert_eq!(g.to_bits(), exact.to_bits(), "{what}: {g} != {exact}");
                assert!(
                    (g as f64 - wide).abs() <= 1e-5 * (1.0 + wide.abs()),
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn products_match_the_host_for_every_shape_and_layout() {
    let d = EmuDevice::new();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        for (shape, mnk) in [(0, (16, 16, 16)), (1, (32, 8, 16)), (2, (8, 32, 16))] {
            for layouts in 0..16 {
                check_product(&d, shape, mnk, layouts);
            }
        }
    }
}

#[test]
fn elementwise_work_on_fragments_is_layout_independent() {
    let d = EmuDevice::new();
    let c = values(256, 3, 4.0);
    let pc = upload(&d, &c);
    let out = d.alloc(256 * 4).unwrap();
    launch(&d, "emu_wmma_elementwise", 32, &[pc.into(), out.into()]).unwrap();
    let got: Vec<f32> = d.dtoh_vec(out, 256).unwrap();
    let want: Vec<f32> = c.iter().map(|&v| v * 2.0 + 1.0).collect();
    assert_eq!(got, want);
}

#[test]
fn a_kernel_assuming_the_hardware_layout_is_wrong_here() {
    let d = EmuDevice::new();
    let c: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let pc = upload(&d, &c);
    let out = d.alloc(256 * 4).unwrap();
    launch(&d, "emu_wmma_assumed_layout", 32, &[pc.into(), out.into()]).unwrap();
    let got: Vec<f32> = d.dtoh_vec(out, 256).unwrap();
    // Every element lands somewhere (the emulator's map is a bijection too), but almost none
    // where the sm_80 layout puts it.
    let mut sorted = got.clone();
    sorted.sort_by(f32::total_cmp);
    assert_eq!(sorted, c);
    let in_place = got.iter().zip(&c).filter(|(g, w)| g == w).count();
    assert!(
        in_place < 16,
        "{in_place} of 256 elements where sm_80 puts them"
    );
}

fn error_of(d: &EmuDevice, name: &str, threads: u32, args: &[Arg]) -> String {
    launch(d, name, threads, args).expect_err("the launch must fail")
}

#[test]
fn divergent_calls_are_launch_errors_not_hangs() {
    let d = EmuDevice::new();
    let a = upload(&d, &vec![0u16; 512]);
    let c = upload(&d, &vec![0f32; 256]);
    let out = d.alloc(64 * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        let err = error_of(
            &d,
            "emu_wmma_divergent_pointer",
            64,
            &[a.into(), out.into()],
        );
        assert!(err.contains("emu_wmma_divergent_pointer"), "{err}");
        assert!(
            err.contains("the lanes of warp ") && err.contains(" disagree"),
            "{err}"
        );
        assert!(
            err.contains("nvcuda::wmma::load_matrix_sync(ptr 0x"),
            "{err}"
        );
        assert!(err.contains("[emu_wmma.cu:"), "{err}");

        let err = error_of(&d, "emu_wmma_divergent_sites", 32, &[c.into(), out.into()]);
        assert!(err.contains("disagree"), "{err}");

        let err = error_of(&d, "emu_wmma_half_warp", 32, &[out.into()]);
        assert!(err.contains("exited"), "{err}");
        assert!(err.contains("nvcuda::wmma::store_matrix_sync"), "{err}");
        println!("{order:?}: {err}");
    }
    // A warp of 16 threads cannot make a warp-wide call.
    let err = error_of(
        &d,
        "emu_wmma_load_at",
        48,
        &[c.into(), Arg::U32(0), Arg::U32(16), out.into()],
    );
    assert!(err.contains("warp 1 has only 16 threads"), "{err}");
}

#[test]
fn misaligned_pointers_and_bad_ldm_are_launch_errors() {
    let d = EmuDevice::new();
    let c = upload(&d, &vec![0f32; 512]);
    let b = upload(&d, &vec![0u16; 512]);
    let out = d.alloc(32 * 4).unwrap();
    let load_at = |offset: u32, ldm: u32| {
        launch(
            &d,
            "emu_wmma_load_at",
            32,
            &[c.into(), Arg::U32(offset), Arg::U32(ldm), out.into()],
        )
    };
    // 8 floats = 32 bytes: aligned; 4 floats = 16 bytes: not.
    load_at(8, 16).unwrap();
    let err = load_at(4, 16).unwrap_err();
    assert!(err.contains("must be 256-bit (32-byte) aligned"), "{err}");
    load_at(0, 20).unwrap();
    let err = load_at(0, 18).unwrap_err();
    assert!(err.contains("ldm 18: ldm must be a multiple of 4"), "{err}");
    let load_b = |ldm: u32| {
        launch(
            &d,
            "emu_wmma_load_b_ldm",
            32,
            &[b.into(), Arg::U32(ldm), out.into()],
        )
    };
    load_b(24).unwrap();
    let err = load_b(20).unwrap_err();
    assert!(err.contains("ldm 20: ldm must be a multiple of 8"), "{err}");
}
