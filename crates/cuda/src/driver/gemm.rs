//! [`Gemm`] on cuBLAS, which is column-major.
//!
//! A row-major `r × c` matrix with row stride `ld` is, read column-major, its `c × r`
//! transpose with leading dimension `ld`. So row-major `out[m,n] = x[m,k] · w[n,k]ᵀ` is
//! column-major `outᵀ (n × m) = w · xᵀ`, where `xᵀ` is `x`'s buffer as stored (`k × m`, `ldx`)
//! and `w` is the transpose of `w`'s buffer as stored (`k × n`, `ldw`):
//! `C = op(A)·op(B)` with `A = w, transa = T, B = x, transb = N`, `m_blas = n`, `n_blas = m`.

use std::ffi::{c_int, c_void};

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType,
};

use crate::device::{ElemType, Gemm};
use crate::error::{CudaError, Result};

/// The arguments of one `cublasGemmEx` call (device addresses as integers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlasGemm {
    pub transa: cublasOperation_t,
    pub transb: cublasOperation_t,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    pub a: u64,
    pub a_type: cudaDataType,
    pub lda: c_int,
    pub b: u64,
    pub b_type: cudaDataType,
    pub ldb: c_int,
    pub c: u64,
    pub c_type: cudaDataType,
    pub ldc: c_int,
    pub beta: f32,
}

/// The cuBLAS call computing `g`, or `None` when the output is empty.
pub fn to_blas(g: &Gemm) -> Result<Option<BlasGemm>> {
    let bad =
        |what: String| CudaError::Invalid(format!("gemm m={} n={} k={}: {what}", g.m, g.n, g.k));
    if g.m == 0 || g.n == 0 {
        return Ok(None);
    }
    for (name, ld, min) in [
        ("ldx", g.ldx, g.k),
        ("ldw", g.ldw, g.k),
        ("ldout", g.ldout, g.n),
    ] {
        if ld < min {
            return Err(bad(format!("{name}={ld} is below the row length {min}")));
        }
    }
    for (name, p) in [("x", g.x), ("w", g.w), ("out", g.out)] {
        if p.is_null() {
            return Err(bad(format!("{name} is null")));
        }
    }
    let (x_type, w_type, out_type) = match (g.x_type, g.w_type, g.out_type) {
        (ElemType::BF16, ElemType::BF16, out) => (
            bf16_or_f32(ElemType::BF16),
            bf16_or_f32(ElemType::BF16),
            bf16_or_f32(out),
        ),
        (ElemType::F32, ElemType::F32, ElemType::F32) => (
            cudaDataType::CUDA_R_32F,
            cudaDataType::CUDA_R_32F,
            cudaDataType::CUDA_R_32F,
        ),
        (x, w, out) => {
            return Err(bad(format!(
                "x {x:?}, w {w:?} → out {out:?} is not a cuBLAS combination (bf16·bf16 → bf16 \
                 or f32, f32·f32 → f32): convert an operand first"
            )));
        }
    };
    let int = |name: &str, v: usize| {
        c_int::try_from(v).map_err(|_| bad(format!("{name}={v} exceeds cuBLAS's 32-bit sizes")))
    };
    Ok(Some(BlasGemm {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: int("n", g.n)?,
        n: int("m", g.m)?,
        k: int("k", g.k)?,
        a: g.w.0,
        a_type: w_type,
        // cuBLAS wants leading dimensions of at least 1, even when k = 0.
        lda: int("ldw", g.ldw.max(1))?,
        b: g.x.0,
        b_type: x_type,
        ldb: int("ldx", g.ldx.max(1))?,
        c: g.out.0,
        c_type: out_type,
        ldc: int("ldout", g.ldout)?,
        beta: if g.accumulate { 1.0 } else { 0.0 },
    }))
}

fn bf16_or_f32(t: ElemType) -> cudaDataType {
    match t {
        ElemType::BF16 => cudaDataType::CUDA_R_16BF,
        ElemType::F32 => cudaDataType::CUDA_R_32F,
    }
}

/// Issues `p` on the handle's stream, accumulating in f32.
///
/// # Safety
/// `handle` is a live cuBLAS handle whose context is current, and `p`'s addresses are device
/// memory of at least the sizes its dimensions imply.
pub unsafe fn run(handle: cublasHandle_t, p: &BlasGemm) -> Result<()> {
    let alpha = 1.0f32;
    let beta = p.beta;
    let addr = |a: u64| a as usize as *const c_void;
    // SAFETY: per this function's contract; alpha and beta are host scalars (the default
    // pointer mode), read before the call returns (and captured by value in a graph).
    unsafe {
        cudarc::cublas::result::gemm_ex(
            handle,
            p.transa,
            p.transb,
            p.m,
            p.n,
            p.k,
            (&alpha as *const f32).cast(),
            addr(p.a),
            p.a_type,
            p.lda,
            addr(p.b),
            p.b_type,
            p.ldb,
            (&beta as *const f32).cast(),
            addr(p.c) as *mut c_void,
            p.c_type,
            p.ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| {
        CudaError::Blas(format!(
            "cublasGemmEx (m={} n={} k={}): {:?}",
            p.m, p.n, p.k, e.0
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DevPtr;

    /// Column-major `C = op(A)·op(B) + beta·C` as cuBLAS defines it, on host arrays whose
    /// "addresses" are element offsets into `a`, `b` and `c`.
    fn blas_reference(p: &BlasGemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let (lda, ldb, ldc) = (p.lda as usize, p.ldb as usize, p.ldc as usize);
        let (a0, b0, c0) = (p.a as usize, p.b as usize, p.c as usize);
        let op_a = |i: usize, l: usize| match p.transa {
            cublasOperation_t::CUBLAS_OP_N => a[a0 + i + l * lda],
            _ => a[a0 + l + i * lda],
        };
        let op_b = |l: usize, j: usize| match p.transb {
            cublasOperation_t::CUBLAS_OP_N => b[b0 + l + j * ldb],
            _ => b[b0 + j + l * ldb],
        };
        for j in 0..n {
            for i in 0..m {
                let sum: f32 = (0..k).map(|l| op_a(i, l) * op_b(l, j)).sum();
                let out = &mut c[c0 + i + j * ldc];
                *out = sum + p.beta * *out;
            }
        }
    }

    fn gemm(m: usize, n: usize, k: usize, ld_pad: usize, accumulate: bool) -> Gemm {
        Gemm {
            m,
            n,
            k,
            x: DevPtr(3),
            x_type: ElemType::F32,
            ldx: k + ld_pad,
            w: DevPtr(5),
            w_type: ElemType::F32,
            ldw: k + 2 * ld_pad,
            out: DevPtr(7),
            out_type: ElemType::F32,
            ldout: n + 3 * ld_pad,
            accumulate,
        }
    }

    /// Deterministic, distinct small values.
    fn fill(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 17) as f32 - 8.0)
            .collect()
    }

    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        for (m, n, k, pad, accumulate) in [
            (1, 1, 1, 0, false),
            (3, 5, 7, 0, false),
            (4, 6, 5, 2, true),
            (5, 2, 9, 1, false),
        ] {
            let g = gemm(m, n, k, pad, accumulate);
            let x = fill(3 + m * g.ldx, 1);
            let w = fill(5 + n * g.ldw, 2);
            let out0 = fill(7 + m * g.ldout, 3);
            let mut expected = out0.clone();
            for i in 0..m {
                for j in 0..n {
                    let dot: f32 = (0..k)
                        .map(|l| x[3 + i * g.ldx + l] * w[5 + j * g.ldw + l])
                        .sum();
                    let o = &mut expected[7 + i * g.ldout + j];
                    *o = dot + if accumulate { *o } else { 0.0 };
                }
            }
            let p = to_blas(&g).expect("valid").expect("non-empty");
            assert_eq!((p.m, p.n, p.k), (n as c_int, m as c_int, k as c_int));
            let mut out = out0.clone();
            // cuBLAS reads A = w and B = x: the reference gets them in that order.
            blas_reference(&p, &w, &x, &mut out);
            assert_eq!(
                out, expected,
                "m={m} n={n} k={k} pad={pad} acc={accumulate}"
            );
        }
    }

    #[test]
    fn element_types_map_to_cublas_types() {
        let mut g = gemm(2, 3, 4, 0, false);
        let p = to_blas(&g).expect("ok").expect("some");
        assert_eq!(
            (p.a_type, p.b_type, p.c_type),
            (
                cudaDataType::CUDA_R_32F,
                cudaDataType::CUDA_R_32F,
                cudaDataType::CUDA_R_32F
            )
        );
        assert_eq!(p.beta, 0.0);
        g.x_type = ElemType::BF16;
        g.w_type = ElemType::BF16;
        g.out_type = ElemType::BF16;
        g.accumulate = true;
        let p = to_blas(&g).expect("ok").expect("some");
        assert_eq!(
            (p.a_type, p.b_type, p.c_type),
            (
                cudaDataType::CUDA_R_16BF,
                cudaDataType::CUDA_R_16BF,
                cudaDataType::CUDA_R_16BF
            )
        );
        assert_eq!(p.beta, 1.0);
        g.out_type = ElemType::F32;
        assert_eq!(
            to_blas(&g).expect("ok").expect("some").c_type,
            cudaDataType::CUDA_R_32F
        );
        g.w_type = ElemType::F32;
        assert!(matches!(to_blas(&g), Err(CudaError::Invalid(_))));
        let mut g = gemm(2, 3, 4, 0, false);
        g.out_type = ElemType::BF16;
        assert!(matches!(to_blas(&g), Err(CudaError::Invalid(_))));
    }

    #[test]
    fn bad_shapes_are_refused_and_empty_ones_skipped() {
        assert_eq!(to_blas(&gemm(0, 3, 4, 0, false)).expect("ok"), None);
        assert_eq!(to_blas(&gemm(3, 0, 4, 0, false)).expect("ok"), None);
        let mut g = gemm(2, 3, 4, 0, false);
        g.ldx = 3;
        let err = to_blas(&g).expect_err("ldx < k");
        assert!(err.to_string().contains("ldx=3"), "{err}");
        let mut g = gemm(2, 3, 4, 0, false);
        g.ldout = 2;
        assert!(to_blas(&g).is_err());
        let mut g = gemm(2, 3, 4, 0, false);
        g.w = DevPtr::NULL;
        assert!(to_blas(&g).is_err());
        let g = gemm(2, 3, 1 << 31, 0, false);
        assert!(
            to_blas(&g)
                .expect_err("k too large")
                .to_string()
                .contains("32-bit")
        );
        let p = to_blas(&gemm(2, 3, 0, 0, false))
            .expect("ok")
            .expect("some");
        assert_eq!((p.k, p.lda, p.ldb), (0, 1, 1));
    }
}
