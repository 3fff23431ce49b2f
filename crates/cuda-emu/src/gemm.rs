//! The host matrix product behind [`lmi_cuda::Device::gemm`]: `out[m, n] (+)= Σ_k x[m, k] ·
//! w[n, k]`, each output element accumulated in f32 with k ascending, bf16 inputs widened
//! exactly, a bf16 output rounded to nearest even (as common.cuh's `f32_to_bf16`).

use lmi_cuda::{CudaError, DevPtr, ElemType, Gemm, Result};
use rayon::prelude::*;

use crate::memory::Memory;

/// Checks every operand against the live allocations, then computes.
pub(crate) fn gemm(mem: &Memory, g: &Gemm) -> Result<()> {
    let invalid = |msg: String| {
        Err(CudaError::Invalid(format!(
            "gemm {}x{}x{}: {msg}",
            g.m, g.n, g.k
        )))
    };
    if g.ldx < g.k || g.ldw < g.k || g.ldout < g.n {
        return invalid(format!(
            "leading dimensions ldx {} / ldw {} must be >= k and ldout {} >= n",
            g.ldx, g.ldw, g.ldout
        ));
    }
    if g.m == 0 || g.n == 0 {
        return Ok(());
    }
    for (name, p, t) in [
        ("x", g.x, g.x_type),
        ("w", g.w, g.w_type),
        ("out", g.out, g.out_type),
    ] {
        if p.0 % t.size() as u64 != 0 {
            return invalid(format!(
                "{name} at {:#x} is not aligned to its element size",
                p.0
            ));
        }
    }
    let span =
        |rows: usize, ld: usize, cols: usize, t: ElemType| ((rows - 1) * ld + cols) * t.size();
    let out_bytes = span(g.m, g.ldout, g.n, g.out_type);
    mem.check(g.out, out_bytes, "gemm out")?;
    if g.k > 0 {
        let x_bytes = span(g.m, g.ldx, g.k, g.x_type);
        let w_bytes = span(g.n, g.ldw, g.k, g.w_type);
        mem.check(g.x, x_bytes, "gemm x")?;
        mem.check(g.w, w_bytes, "gemm w")?;
        for (name, p, bytes) in [("x", g.x, x_bytes), ("w", g.w, w_bytes)] {
            if overlaps(g.out, out_bytes, p, bytes) {
                return invalid(format!("out overlaps {name}"));
            }
        }
    }
    compute(g);
    Ok(())
}

fn overlaps(a: DevPtr, a_len: usize, b: DevPtr, b_len: usize) -> bool {
    a.0 < b.0 + b_len as u64 && b.0 < a.0 + a_len as u64
}

/// # Safety (internal)
/// Called only after `gemm` checked every operand's range against live allocations and that
/// `out` overlaps neither input; rows of `out` are disjoint (`ldout >= n`).
fn compute(g: &Gemm) {
    let g = *g;
    (0..g.m).into_par_iter().for_each_init(
        || (vec![0f32; g.k], vec![0f32; g.k]),
        |(xrow, wrow), i| {
            read_row(g.x, g.x_type, i * g.ldx, xrow);
            for j in 0..g.n {
                read_row(g.w, g.w_type, j * g.ldw, wrow);
                let mut acc = 0f32;
                for (a, b) in xrow.iter().zip(wrow.iter()) {
                    acc += a * b;
                }
                let at = i * g.ldout + j;
                let v = if g.accumulate {
                    read(g.out, g.out_type, at) + acc
                } else {
                    acc
                };
                write(g.out, g.out_type, at, v);
            }
        },
    );
}

fn read_row(base: DevPtr, t: ElemType, offset: usize, row: &mut [f32]) {
    for (c, v) in row.iter_mut().enumerate() {
        *v = read(base, t, offset + c);
    }
}

fn read(base: DevPtr, t: ElemType, i: usize) -> f32 {
    // SAFETY: see `compute`: the element lies in a checked range; unaligned reads tolerate any
    // element alignment.
    unsafe {
        match t {
            ElemType::F32 => std::ptr::read_unaligned((base.0 as *const f32).add(i)),
            ElemType::BF16 => f32::from_bits(
                (std::ptr::read_unaligned((base.0 as *const u16).add(i)) as u32) << 16,
            ),
        }
    }
}

fn write(base: DevPtr, t: ElemType, i: usize, v: f32) {
    // SAFETY: see `compute`.
    unsafe {
        match t {
            ElemType::F32 => std::ptr::write_unaligned((base.0 as *mut f32).add(i), v),
            ElemType::BF16 => std::ptr::write_unaligned(
                (base.0 as *mut u16).add(i),
                half::bf16::from_f32(v).to_bits(),
            ),
        }
    }
}
