//! `out[m, n] = x[m, k] · w[n, k]ᵀ` for quantized weights ([`QMatrix`]): activations are
//! quantized to int8 per block of 32 (`qact.rs`), each 32-value sub-block's integer dot
//! product runs on `vpdpbusd` (AVX512-VNNI, AVX-VNNI) or `vpmaddubsw` + `vpmaddwd` (AVX-512BW,
//! AVX2), and is scaled into f32 accumulators by the weight's and the activation's scales.
//!
//! Weights are decoded to unsigned bytes in registers straight from ggml's block layouts:
//! value = scale·u + min per lane of 4 values, so the min term is `min · d·Σq` over the
//! activation lane (`QAct::s`). Q8_0 and I8 are signed: |w| times x with w's sign.
//!
//! Batch invariance (see `simd.rs`): every output element goes through the same instructions
//! whatever the tile shape or the batch. Integer dot products are exact, so the VNNI and
//! non-VNNI instructions of one width give the same bits; the 512- and 256-bit paths sum
//! their lanes in another order, and a process uses one path (`qpath`).

use lmi_checkpoint::quant::{QMatrix, QType, dequantize_block};

use super::qact::{LANES, QAct, QK};
use super::qlanes::LMatrix;
use super::qpack::Packed;

/// Which instructions run the products: decided once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QPath {
    /// The lane kernels of `qlanes.rs` (AVX512-VNNI, 12-bit activations, exact block sums).
    Lanes,
    /// The lane kernels on AVX2 (the same bits as `Lanes`).
    LanesAvx2,
    Avx512Vnni,
    Avx512,
    AvxVnni,
    Avx2,
    Scalar,
}

impl QPath {
    /// Every path this CPU can run (tests compare them).
    pub fn available() -> Vec<QPath> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let has = |f: &str| match f {
                "avx512" => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                        && std::arch::is_x86_feature_detected!("avx512dq")
                        && std::arch::is_x86_feature_detected!("f16c")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
                "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
                _ => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                        && std::arch::is_x86_feature_detected!("f16c")
                }
            };
            if has("avx512") && has("avx512vnni") {
                v.push(QPath::Lanes);
                v.push(QPath::Avx512Vnni);
            }
            if has("avx512") {
                v.push(QPath::Avx512);
            }
            if has("avx2") {
                v.push(QPath::LanesAvx2);
            }
            if has("avx2") && has("avxvnni") {
                v.push(QPath::AvxVnni);
            }
            if has("avx2") {
                v.push(QPath::Avx2);
            }
        }
        v.push(QPath::Scalar);
        v
    }

    /// How reports name it.
    pub fn name(self) -> &'static str {
        let int8 = super::qlanes::bits() == Ok(super::qlanes::Bits::Eight);
        match self {
            QPath::Lanes if int8 => "int8 lanes (AVX512-VNNI)",
            QPath::LanesAvx2 if int8 => "int8 lanes (AVX2)",
            QPath::Lanes => "int12 lanes (AVX512-VNNI)",
            QPath::LanesAvx2 => "int12 lanes (AVX2)",
            QPath::Avx512Vnni => "int8 (AVX512-VNNI)",
            QPath::Avx512 => "int8 (AVX-512BW)",
            QPath::AvxVnni => "int8 (AVX-VNNI)",
            QPath::Avx2 => "int8 (AVX2)",
            QPath::Scalar => "int8 (scalar)",
        }
    }

    /// How reports name the kernel a product of `rows` activation rows runs on: the lanes
    /// on AVX512-VNNI move to AMX-INT8 tiles from `qlanes::AMX_MIN_ROWS` rows where the CPU
    /// has them (the same bits).
    pub fn name_for_rows(self, rows: usize) -> String {
        if self == QPath::Lanes
            && rows >= super::qlanes::AMX_MIN_ROWS
            && crate::amx::int8_available()
        {
            let int8 = super::qlanes::bits() == Ok(super::qlanes::Bits::Eight);
            return format!(
                "{} lanes (AMX-INT8 tiles)",
                if int8 { "int8" } else { "int12" }
            );
        }
        self.name().into()
    }

    fn is_512(self) -> bool {
        matches!(self, QPath::Lanes | QPath::Avx512Vnni | QPath::Avx512)
    }
}

/// The path this process uses: the widest available, less what `LMI_CPU_NO_LANES`,
/// `LMI_CPU_NO_AVX512` and `LMI_CPU_NO_VNNI` turn off.
pub fn qpath() -> QPath {
    static PATH: std::sync::OnceLock<QPath> = std::sync::OnceLock::new();
    *PATH.get_or_init(|| {
        let no512 = std::env::var_os("LMI_CPU_NO_AVX512").is_some();
        let novnni = std::env::var_os("LMI_CPU_NO_VNNI").is_some();
        let nolanes = std::env::var_os("LMI_CPU_NO_LANES").is_some();
        QPath::available()
            .into_iter()
            .find(|p| {
                let vnni = matches!(p, QPath::Lanes | QPath::Avx512Vnni | QPath::AvxVnni);
                let lanes = matches!(p, QPath::Lanes | QPath::LanesAvx2);
                !(no512 && p.is_512() || novnni && vnni || nolanes && lanes)
            })
            .unwrap_or(QPath::Scalar)
    })
}

/// Input rows per tile at most.
const MR_MAX: usize = 4;
/// Up to this many rows, weight tiles are the outer loop (each is decoded once per row tile
/// while in L1); beyond, row tiles are (the chunk's weights stay in L2).
const SMALL_M: usize = 64;

/// A quantized matrix in the form the process's path reads: the file's blocks for the
/// 256-bit and scalar paths, [`Packed`] for AVX-512. Row ranges in order: a fused QKV may mix
/// formats, as Q4_K_M files do.
pub enum QWeight {
    Native(Vec<QMatrix>),
    Packed(Vec<Packed>),
    /// The lane layout of `qlanes.rs` (AVX512-VNNI or AVX2): exact block sums, batch
    /// invariant.
    Lanes(Vec<LMatrix>),
}

impl QWeight {
    pub fn new(parts: Vec<QMatrix>) -> QWeight {
        QWeight::for_path(parts, qpath())
    }

    pub fn for_path(parts: Vec<QMatrix>, path: QPath) -> QWeight {
        if matches!(path, QPath::Lanes | QPath::LanesAvx2) {
            QWeight::Lanes(parts.iter().map(LMatrix::new).collect())
        } else if path.is_512() {
            QWeight::Packed(parts.iter().map(Packed::new).collect())
        } else {
            QWeight::Native(parts)
        }
    }

    /// Whether the kernels take these parts: one width, a whole number of 32-value blocks.
    pub fn supports(parts: &[QMatrix]) -> bool {
        parts
            .first()
            .is_some_and(|p| p.cols.is_multiple_of(QK) && parts.iter().all(|q| q.cols == p.cols))
    }

    pub fn bytes(&self) -> usize {
        match self {
            QWeight::Native(p) => p.iter().map(QMatrix::bytes).sum(),
            QWeight::Packed(p) => p.iter().map(Packed::bytes).sum(),
            QWeight::Lanes(p) => p.iter().map(LMatrix::size_bytes).sum(),
        }
    }

    fn part_rows(&self) -> Vec<usize> {
        match self {
            QWeight::Native(p) => p.iter().map(|m| m.rows).collect(),
            QWeight::Packed(p) => p.iter().map(|m| m.rows).collect(),
            QWeight::Lanes(p) => p.iter().map(|m| m.rows).collect(),
        }
    }

    fn cols(&self) -> usize {
        match self {
            QWeight::Native(p) => p.first().map_or(0, |m| m.cols),
            QWeight::Packed(p) => p.first().map_or(0, |m| m.cols),
            QWeight::Lanes(p) => p.first().map_or(0, |m| m.cols),
        }
    }

    /// Row `r` of the concatenated parts, dequantized (embedding lookups).
    pub fn row_into(&self, mut r: usize, out: &mut [f32]) {
        for (i, n) in self.part_rows().into_iter().enumerate() {
            if r < n {
                return match self {
                    QWeight::Native(p) => p[i].dequantize_row(r, out),
                    QWeight::Packed(p) => p[i].dequantize_row(r, out),
                    QWeight::Lanes(p) => p[i].dequantize_row(r, out),
                };
            }
            r -= n;
        }
        out.fill(0.0);
    }
}

/// `out[m, n] = x[m, k] · wᵀ (+ bias)`.
pub fn qlinear(x: &[f32], m: usize, w: &QWeight, bias: Option<&[f32]>, out: &mut [f32]) {
    qlinear_with(qpath(), x, m, w, bias, out)
}

/// `out[i, j] += bias[j]` over `m` rows of `n`.
fn add_bias(out: &mut [f32], m: usize, n: usize, bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in out[..m * n].chunks_exact_mut(n) {
            for (v, &bv) in row.iter_mut().zip(b) {
                *v += bv;
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Tile {
    part: usize,
    /// First weight row in the part.
    row: usize,
    /// First output column.
    col: usize,
    nr: usize,
}

#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint column ranges of the output.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The output at `offset` (a method, so closures capture the whole `Sync` wrapper).
    ///
    /// # Safety
    /// `offset` must lie inside the output.
    pub(crate) unsafe fn at(&self, offset: usize) -> *mut f32 {
        unsafe { self.0.add(offset) }
    }
}

/// [`qlinear`] on a given path; `w` must be in that path's form ([`QWeight::for_path`]).
pub fn qlinear_with(
    path: QPath,
    x: &[f32],
    m: usize,
    w: &QWeight,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let k = w.cols();
    let part_rows = w.part_rows();
    let n: usize = part_rows.iter().sum();
    assert!(k.is_multiple_of(QK) && x.len() >= m * k && out.len() >= m * n);
    let laid_out = match w {
        QWeight::Native(_) => !path.is_512() && path != QPath::LanesAvx2,
        QWeight::Packed(_) => path.is_512() && path != QPath::Lanes,
        QWeight::Lanes(_) => matches!(path, QPath::Lanes | QPath::LanesAvx2),
    };
    assert!(laid_out, "weights laid out for another path than {path:?}");
    if m == 0 || n == 0 {
        return;
    }
    if let QWeight::Lanes(parts) = w {
        use super::qlanes::Isa;
        let isa = if path == QPath::Lanes && crate::amx::int8_available() {
            Isa::Amx
        } else if path == QPath::Lanes {
            Isa::Avx512Vnni
        } else {
            Isa::Avx2
        };
        // An unknown setting fails the model's load (`CpuBackend::upload_weight`).
        let bits = super::qlanes::bits().unwrap_or(super::qlanes::Bits::Twelve);
        super::qlanes::qlinear_lanes(isa, bits, x, m, parts, out);
        return add_bias(out, m, n, bias);
    }
    let a = if path.is_512() {
        QAct::paired(x, m, k)
    } else {
        QAct::new(x, m, k)
    };
    // Weight rows per tile: a single input row streams many weight rows at once; batches
    // share each decoded pair across MR_MAX rows (8×2 tiles measured no faster than 4×4).
    let nrm = match (path.is_512(), m) {
        (true, 1) => 8,
        (true, _) | (false, 1) => 4,
        (false, _) => 2,
    };
    let mut tiles = Vec::with_capacity(n / nrm + part_rows.len() * 2);
    let mut col = 0;
    for (pi, &rows) in part_rows.iter().enumerate() {
        let mut r = 0;
        while r < rows {
            let left = rows - r;
            let nr = if left >= nrm {
                nrm
            } else if left >= 4 && nrm > 4 {
                4
            } else {
                1
            };
            tiles.push(Tile {
                part: pi,
                row: r,
                col,
                nr,
            });
            r += nr;
            col += nr;
        }
    }
    let mut rows = Vec::with_capacity(m / MR_MAX + MR_MAX);
    let mut i = 0;
    while i < m {
        let mr = if m - i >= MR_MAX { MR_MAX } else { 1 };
        rows.push((i, mr));
        i += mr;
    }
    let threads = crate::pool::threads();
    let per = if m * n * k < 1 << 16 || threads == 1 {
        tiles.len()
    } else {
        tiles.len().div_ceil(threads * 4).max(1)
    };
    let o = SendPtr(out.as_mut_ptr());
    let run = |chunk: &[Tile]| {
        let one = |t: &Tile, i: usize, mr: usize| {
            // SAFETY: the tile's weight rows exist in its part, its input rows in `a`, and
            // its output columns are this chunk's alone.
            unsafe {
                let out = o.at(i * n + t.col);
                match w {
                    QWeight::Native(p) => tile(path, &a, &p[t.part], t.row, t.nr, i, mr, out, n),
                    QWeight::Packed(p) => {
                        // Weight tiles outer: the first row tile brings the next weight
                        // tile in, the others find it cached.
                        let prefetch = m > SMALL_M || i == 0;
                        packed_tile(path, &a, &p[t.part], t.row, t.nr, i, mr, out, n, prefetch)
                    }
                    QWeight::Lanes(_) => unreachable!("lane weights returned above"),
                }
            }
        };
        if m <= SMALL_M {
            for t in chunk {
                for &(i, mr) in &rows {
                    one(t, i, mr);
                }
            }
        } else {
            for &(i, mr) in &rows {
                for t in chunk {
                    one(t, i, mr);
                }
            }
        }
    };
    if per >= tiles.len() {
        run(&tiles);
    } else {
        crate::pool::run(tiles.len().div_ceil(per), |c| {
            run(&tiles[c * per..((c + 1) * per).min(tiles.len())])
        });
    }
    add_bias(out, m, n, bias);
}

/// Runs `$kernel::<Format, MR, NR>(&$args)` for the tile's format and shape (the format
/// types of the caller's path in scope); other shapes run as 1×1 tiles.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch {
    ($kernel:ident, $args_ty:ident, $args:expr, $qtype:expr, $mr:expr, $nr:expr) => {{
        let args = $args;
        let (mr, nr) = ($mr, $nr);
        macro_rules! by_shape {
            ($f:ty) => {
                match (mr, nr) {
                    (1, 8) => $kernel::<$f, 1, 8>(&args),
                    (1, 4) => $kernel::<$f, 1, 4>(&args),
                    (1, 2) => $kernel::<$f, 1, 2>(&args),
                    (4, 4) => $kernel::<$f, 4, 4>(&args),
                    (4, 2) => $kernel::<$f, 4, 2>(&args),
                    (4, 1) => $kernel::<$f, 4, 1>(&args),
                    _ => {
                        for r in 0..mr {
                            for c in 0..nr {
                                let one = $args_ty {
                                    i0: args.i0 + r,
                                    w: args.w.add(c * args.rb),
                                    rs: if args.rs.is_null() {
                                        args.rs
                                    } else {
                                        args.rs.add(c)
                                    },
                                    out: args.out.add(r * args.ldo + c),
                                    ..args
                                };
                                $kernel::<$f, 1, 1>(&one);
                            }
                        }
                    }
                }
            };
        }
        match $qtype {
            QType::Q8_0 => by_shape!(Q8_0),
            QType::Q4_0 => by_shape!(Q4_0),
            QType::Q4_1 => by_shape!(Q4_1),
            QType::Q4_K => by_shape!(Q4K),
            QType::Q6_K => by_shape!(Q6K),
            QType::MXFP4 => by_shape!(Mxfp4),
            QType::I8 => by_shape!(I8),
        }
    }};
}

/// One tile of packed weights on an AVX-512 path.
///
/// # Safety
/// As [`tile`].
#[allow(clippy::too_many_arguments)]
unsafe fn packed_tile(
    path: QPath,
    a: &QAct,
    w: &Packed,
    row: usize,
    nr: usize,
    i: usize,
    mr: usize,
    out: *mut f32,
    ldo: usize,
    prefetch: bool,
) {
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use super::qpack::x86::*;
        use x86::{PArgs, kp_bw, kp_vnni};
        let args = PArgs {
            a,
            i0: i,
            w: w.data.as_ptr().add(row * w.row_bytes),
            rb: w.row_bytes,
            rs: if w.qtype == QType::I8 {
                w.row_scale.as_ptr().add(row)
            } else {
                std::ptr::null()
            },
            nsub: w.nsub,
            out,
            ldo,
            prefetch,
        };
        match path {
            QPath::Avx512Vnni => dispatch!(kp_vnni, PArgs, args, w.qtype, mr, nr),
            QPath::Avx512 => dispatch!(kp_bw, PArgs, args, w.qtype, mr, nr),
            _ => unreachable!("packed weights are read on the AVX-512 int8 paths"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, a, w, row, nr, i, mr, out, ldo, prefetch);
        unreachable!("packed weights are read on AVX-512 paths");
    }
}

/// One `mr × nr` tile: rows `i..i+mr` of the activations against weight rows `row..row+nr`
/// of `w`, into `out[(i + r)·ldo + c]` for c in 0..nr.
///
/// # Safety
/// Rows and output extents as described must exist.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    path: QPath,
    a: &QAct,
    w: &QMatrix,
    row: usize,
    nr: usize,
    i: usize,
    mr: usize,
    out: *mut f32,
    ldo: usize,
) {
    let rb = w.row_bytes();
    let args = TileArgs {
        a,
        i0: i,
        w: unsafe { w.data.as_ptr().add(row * rb) },
        rb,
        rs: if w.qtype == QType::I8 {
            unsafe { w.row_scale.as_ptr().add(row) }
        } else {
            std::ptr::null()
        },
        nsub: w.cols / QK,
        out,
        ldo,
    };
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use x86::*;
        match path {
            QPath::Lanes | QPath::Avx512Vnni | QPath::Avx512 => {
                unreachable!("AVX-512 paths read packed weights")
            }
            QPath::AvxVnni => return dispatch!(k256_vnni, TileArgs, args, w.qtype, mr, nr),
            QPath::LanesAvx2 => unreachable!("lane weights are read by qlanes"),
            QPath::Avx2 => return dispatch!(k256_avx2, TileArgs, args, w.qtype, mr, nr),
            QPath::Scalar => {}
        }
    }
    unsafe { scalar_tile(&args, w.qtype, mr, nr) }
}

#[derive(Clone, Copy)]
struct TileArgs<'a> {
    a: &'a QAct,
    /// First activation row.
    i0: usize,
    /// First weight row's bytes.
    w: *const u8,
    /// Bytes per weight row.
    rb: usize,
    /// I8 row scales from the first weight row (null for the other formats).
    rs: *const f32,
    /// 32-value sub-blocks per row.
    nsub: usize,
    out: *mut f32,
    ldo: usize,
}

/// Any CPU: dequantized weight blocks against the int8 activations, one element at a time.
unsafe fn scalar_tile(t: &TileArgs, qtype: QType, mr: usize, nr: usize) {
    let (b, bb) = (qtype.block(), qtype.block_bytes());
    let mut wf = vec![0f32; b];
    for c in 0..nr {
        let row = unsafe { std::slice::from_raw_parts(t.w.add(c * t.rb), t.rb) };
        let scale = if t.rs.is_null() {
            1.0
        } else {
            unsafe { *t.rs.add(c) }
        };
        for r in 0..mr {
            let ar = t.i0 + r;
            let mut acc = 0f32;
            for (blk, wb) in row.chunks_exact(bb).enumerate() {
                dequantize_block(qtype, wb, &mut wf);
                for (s, wf) in wf.chunks_exact(QK).enumerate() {
                    let xb = ar * t.a.nb + blk * b / QK + s;
                    let q = &t.a.q[xb * QK..(xb + 1) * QK];
                    for l in 0..LANES {
                        let d = t.a.dl[xb * LANES + l];
                        let dot: f32 = (4 * l..4 * l + 4).map(|v| wf[v] * f32::from(q[v])).sum();
                        acc += dot * scale * d;
                    }
                }
            }
            unsafe { *t.out.add(r * t.ldo + c) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, QK, TileArgs};
    use lmi_checkpoint::quant::QType;

    /// A weight format decoded one 32-value sub-block at a time.
    pub trait Fmt {
        const QTYPE: QType;
        /// Q8_0 and I8: the bytes are signed values, no min term.
        const SIGNED: bool;
        /// What `decode` needs of a whole block, read once per block and weight row rather
        /// than once per sub-block: the K-quants' 8 or 16 scales of 256 values, the row scale
        /// of I8, nothing for the others.
        type Head: Copy + Default;
        /// Block `blk`'s head.
        ///
        /// # Safety
        /// `row` must hold the row; the caller runs with AVX2, FMA and F16C.
        unsafe fn head(row: *const u8, blk: usize, rs: f32) -> Self::Head;
        /// Sub-block `sb` of a row: 32 unsigned (or signed) values in order, the scale of
        /// each lane of 4 values, and the min added per value.
        ///
        /// # Safety
        /// As `head`; `h` is the head of the block holding `sb`.
        unsafe fn decode(row: *const u8, sb: usize, h: &Self::Head) -> (__m256i, __m256, __m256);
    }

    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        unsafe {
            let bits = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
        }
    }

    /// 16 bytes of nibbles → 32 values: low nibbles first, then high (Q4_0 and Q4_1).
    #[inline(always)]
    unsafe fn nibbles16(p: *const u8) -> __m256i {
        unsafe {
            let v = _mm_loadu_si128(p as *const __m128i);
            let m4 = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(v, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m4);
            _mm256_set_m128i(hi, lo)
        }
    }

    pub struct Q8_0;
    pub struct I8;
    pub struct Q4_0;
    pub struct Q4_1;
    pub struct Q4K;
    pub struct Q6K;
    pub struct Mxfp4;

    impl Fmt for Mxfp4 {
        const QTYPE: QType = QType::MXFP4;
        const SIGNED: bool = true;
        type Head = ();
        #[inline(always)]
        unsafe fn head(_: *const u8, _: usize, _: f32) {}
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, _: &()) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb * 17);
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    lmi_checkpoint::quant::FP4_X2.as_ptr() as *const __m128i,
                ));
                let q = _mm256_shuffle_epi8(table, nibbles16(b.add(1)));
                let d = lmi_checkpoint::quant::half_e8m0(*b);
                (q, _mm256_set1_ps(d), _mm256_setzero_ps())
            }
        }
    }

    impl Fmt for Q8_0 {
        const QTYPE: QType = QType::Q8_0;
        const SIGNED: bool = true;
        type Head = ();
        #[inline(always)]
        unsafe fn head(_: *const u8, _: usize, _: f32) {}
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, _: &()) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb * 34);
                let q = _mm256_loadu_si256(b.add(2) as *const __m256i);
                (q, _mm256_set1_ps(f16_at(b)), _mm256_setzero_ps())
            }
        }
    }

    impl Fmt for I8 {
        const QTYPE: QType = QType::I8;
        const SIGNED: bool = true;
        type Head = f32;
        #[inline(always)]
        unsafe fn head(_: *const u8, _: usize, rs: f32) -> f32 {
            rs
        }
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, rs: &f32) -> (__m256i, __m256, __m256) {
            unsafe {
                let q = _mm256_loadu_si256(row.add(sb * 32) as *const __m256i);
                (q, _mm256_set1_ps(*rs), _mm256_setzero_ps())
            }
        }
    }

    impl Fmt for Q4_0 {
        const QTYPE: QType = QType::Q4_0;
        const SIGNED: bool = false;
        type Head = ();
        #[inline(always)]
        unsafe fn head(_: *const u8, _: usize, _: f32) {}
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, _: &()) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb * 18);
                let d = f16_at(b);
                (
                    nibbles16(b.add(2)),
                    _mm256_set1_ps(d),
                    _mm256_set1_ps(-8.0 * d),
                )
            }
        }
    }

    impl Fmt for Q4_1 {
        const QTYPE: QType = QType::Q4_1;
        const SIGNED: bool = false;
        type Head = ();
        #[inline(always)]
        unsafe fn head(_: *const u8, _: usize, _: f32) {}
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, _: &()) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb * 20);
                (
                    nibbles16(b.add(4)),
                    _mm256_set1_ps(f16_at(b)),
                    _mm256_set1_ps(f16_at(b.add(2))),
                )
            }
        }
    }

    impl Fmt for Q4K {
        const QTYPE: QType = QType::Q4_K;
        const SIGNED: bool = false;
        /// Each sub-block's scale and (negated) min.
        type Head = ([f32; 8], [f32; 8]);
        #[inline(always)]
        unsafe fn head(row: *const u8, blk: usize, _: f32) -> Self::Head {
            unsafe {
                let b = row.add(blk * 144);
                let scales = std::slice::from_raw_parts(b.add(4), 12);
                let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
                let mut h = ([0f32; 8], [0f32; 8]);
                for s in 0..8 {
                    let (sc, mn) = lmi_checkpoint::quant::scale_min_k4(s, scales);
                    h.0[s] = d * f32::from(sc);
                    h.1[s] = -(dmin * f32::from(mn));
                }
                h
            }
        }
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, h: &Self::Head) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb / 8 * 144);
                let s = sb % 8;
                let v = _mm256_loadu_si256(b.add(16 + 32 * (s / 2)) as *const __m256i);
                let m4 = _mm256_set1_epi8(0x0f);
                // Low nibbles for even sub-blocks, high for odd: a shift by a count, not a
                // branch (alternating branches cost more than the shift).
                let shift = _mm_cvtsi32_si128(4 * (s & 1) as i32);
                let q = _mm256_and_si256(_mm256_srl_epi16(v, shift), m4);
                (q, _mm256_set1_ps(h.0[s]), _mm256_set1_ps(h.1[s]))
            }
        }
    }

    impl Fmt for Q6K {
        const QTYPE: QType = QType::Q6_K;
        const SIGNED: bool = false;
        /// The 16 scales (one per 16 values) times the block's d.
        type Head = [f32; 16];
        #[inline(always)]
        unsafe fn head(row: *const u8, blk: usize, _: f32) -> [f32; 16] {
            unsafe {
                let b = row.add(blk * 210);
                let d = f16_at(b.add(208));
                std::array::from_fn(|i| d * f32::from(*b.add(192 + i) as i8))
            }
        }
        #[inline(always)]
        unsafe fn decode(row: *const u8, sb: usize, hd: &[f32; 16]) -> (__m256i, __m256, __m256) {
            unsafe {
                let b = row.add(sb / 8 * 210);
                let (h, t) = (sb % 8 / 4, sb % 4);
                let ql = _mm256_loadu_si256(b.add(64 * h + 32 * (t & 1)) as *const __m256i);
                let m4 = _mm256_set1_epi8(0x0f);
                let shift = _mm_cvtsi32_si128(4 * (t >> 1) as i32);
                let lo = _mm256_and_si256(_mm256_srl_epi16(ql, shift), m4);
                let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                let hb = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)),
                    _mm256_set1_epi8(3),
                );
                let q = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb));
                let (s0, s1) = (hd[8 * h + 2 * t], hd[8 * h + 2 * t + 1]);
                let scale = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                (q, scale, _mm256_mul_ps(scale, _mm256_set1_ps(-32.0)))
            }
        }
    }

    // The integer dot products: lane l gets Σ u[4l..4l+4]·s[4l..4l+4], exactly (the operands
    // stay below vpmaddubsw's saturation: |u| ≤ 128 against |s| ≤ 127 sums to ≤ 32512).

    #[inline(always)]
    unsafe fn dot512_vnni(u: __m512i, s: __m512i) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s) }
    }

    #[inline(always)]
    unsafe fn dot512_bw(u: __m512i, s: __m512i) -> __m512i {
        unsafe { _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)) }
    }

    #[inline(always)]
    unsafe fn dot256_vnni(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }

    #[inline(always)]
    unsafe fn dot256_avx2(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }

    /// One sub-block per step in 256-bit registers.
    macro_rules! kernel256 {
        ($name:ident, $features:literal, $dot:ident) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $name<F: Fmt, const MR: usize, const NR: usize>(t: &TileArgs) {
                unsafe {
                    let zf = _mm256_setzero_ps();
                    let zero = _mm256_setzero_si256();
                    let mut acc = [[zf; NR]; MR];
                    let (q, dl, s) = (t.a.q.as_ptr(), t.a.dl.as_ptr(), t.a.s.as_ptr());
                    let per_block = F::QTYPE.block() / QK;
                    let mut heads = [F::Head::default(); NR];
                    for sb in 0..t.nsub {
                        if sb.is_multiple_of(per_block) {
                            for (j, h) in heads.iter_mut().enumerate() {
                                let rs = if t.rs.is_null() { 1.0 } else { *t.rs.add(j) };
                                *h = F::head(t.w.add(j * t.rb), sb / per_block, rs);
                            }
                        }
                        let mut wq = [zero; NR];
                        let mut wsign = [zero; NR];
                        let mut ws = [zf; NR];
                        let mut wm = [zf; NR];
                        for j in 0..NR {
                            let row = t.w.add(j * t.rb);
                            // The next tile's row j, as far along as this sub-block is in
                            // this one (proportionally: a K-quant block spans 8 sub-blocks).
                            _mm_prefetch::<_MM_HINT_T0>(
                                row.wrapping_add(NR * t.rb + sb * t.rb / t.nsub) as *const i8,
                            );
                            let (v, sc, mn) = F::decode(row, sb, &heads[j]);
                            if F::SIGNED {
                                wsign[j] = v;
                                wq[j] = _mm256_sign_epi8(v, v);
                            } else {
                                wq[j] = v;
                            }
                            ws[j] = sc;
                            wm[j] = mn;
                        }
                        for (i, acc) in acc.iter_mut().enumerate() {
                            let xb = (t.i0 + i) * t.a.nb + sb;
                            let xq = _mm256_loadu_si256(q.add(xb * QK) as *const __m256i);
                            let xd = _mm256_loadu_ps(dl.add(xb * LANES));
                            let xs = _mm256_loadu_ps(s.add(xb * LANES));
                            for j in 0..NR {
                                let x = if F::SIGNED {
                                    _mm256_sign_epi8(xq, wsign[j])
                                } else {
                                    xq
                                };
                                let d = _mm256_cvtepi32_ps($dot(wq[j], x));
                                acc[j] = _mm256_fmadd_ps(d, _mm256_mul_ps(ws[j], xd), acc[j]);
                                if !F::SIGNED {
                                    acc[j] = _mm256_fmadd_ps(wm[j], xs, acc[j]);
                                }
                            }
                        }
                    }
                    for (i, acc) in acc.iter().enumerate() {
                        for (j, a) in acc.iter().enumerate() {
                            let hi = _mm256_extractf128_ps::<1>(*a);
                            let lo = _mm256_castps256_ps128(*a);
                            let q4 = _mm_add_ps(lo, hi);
                            let d2 = _mm_add_ps(q4, _mm_movehl_ps(q4, q4));
                            *t.out.add(i * t.ldo + j) =
                                _mm_cvtss_f32(_mm_add_ss(d2, _mm_shuffle_ps::<1>(d2, d2)));
                        }
                    }
                }
            }
        };
    }

    /// How many tiles ahead the packed kernel prefetches. Reading 1B-shaped matrices from
    /// memory at batch 1 (A/B in one process, against a plain read of the same bytes): 85–94%
    /// of the read rate one tile ahead with the prefetches spread over the pairs; 65–92% with
    /// them issued in bursts per group; two tiles ahead no better; no prefetch about 45%.
    const PREFETCH_TILES: usize = 1;

    /// A tile of packed weights (`qpack.rs`) against paired activations (`QAct::paired`).
    #[derive(Clone, Copy)]
    pub struct PArgs<'a> {
        pub a: &'a crate::qact::QAct,
        pub i0: usize,
        pub w: *const u8,
        pub rb: usize,
        pub rs: *const f32,
        pub nsub: usize,
        pub out: *mut f32,
        pub ldo: usize,
        /// Whether to prefetch the next tile (the first pass over a weight tile does).
        pub prefetch: bool,
    }

    /// A pair of 32-value sub-blocks per step: each group's scales are loaded once per
    /// weight row and spread to the pair's lanes with one permute.
    macro_rules! packed512 {
        ($name:ident, $features:literal, $dot:ident, $offset:literal) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $name<F: crate::qpack::x86::PFmt, const MR: usize, const NR: usize>(
                t: &PArgs,
            ) {
                unsafe {
                    let zero = _mm512_setzero_si512();
                    let zf = _mm512_setzero_ps();
                    let mut acc = [[zf; NR]; MR];
                    let (q, dl) = (t.a.q.as_ptr(), t.a.dl.as_ptr());
                    let npairs = t.nsub / 2;
                    let apairs = t.a.nb / 2;
                    // Signed values: offset to unsigned (exact in vpdpbusd's 32-bit sums), or
                    // |w| against x with w's sign where vpmaddubsw would saturate.
                    let offset = F::SIGNED && $offset;
                    let signed = F::SIGNED && !$offset;
                    // A tile's rows are contiguous, and the next tiles follow: each pair step
                    // prefetches its share of the bytes PREFETCH_TILES tiles ahead, one
                    // steady sequential stream. (Eight rows read at once outrun the hardware
                    // prefetcher. Past a chunk's end the lines are another thread's, and
                    // prefetches never fault.)
                    let tile_bytes = NR * t.rb;
                    let per_pair = tile_bytes.div_ceil(npairs).next_multiple_of(64);
                    let ahead = t.w.wrapping_add(PREFETCH_TILES * tile_bytes);
                    let mut g = 0;
                    while g * F::GROUP < npairs {
                        let mut gs = [zf; NR];
                        let mut gm = [zf; NR];
                        for j in 0..NR {
                            let rs = if t.rs.is_null() { 1.0 } else { *t.rs.add(j) };
                            (gs[j], gm[j]) = F::group(t.w.add(j * t.rb), g, rs, t.nsub);
                            if offset {
                                gm[j] = _mm512_mul_ps(gs[j], _mm512_set1_ps(-128.0));
                            }
                        }
                        if !signed {
                            // The min term of the whole group, once per weight row.
                            for (i, acc) in acc.iter_mut().enumerate() {
                                let xs = F::min_sums(t.a, t.i0 + i, g);
                                for j in 0..NR {
                                    acc[j] = _mm512_fmadd_ps(gm[j], xs, acc[j]);
                                }
                            }
                        }
                        let pairs = (npairs - g * F::GROUP).min(F::GROUP);
                        for pp in 0..pairs {
                            let p = g * F::GROUP + pp;
                            let at = ahead.wrapping_add(p * per_pair);
                            let mut l = if t.prefetch { 0 } else { per_pair };
                            while l < per_pair {
                                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(l) as *const i8);
                                l += 64;
                            }
                            let idx = F::index(pp);
                            let mut wq = [zero; NR];
                            let mut wneg = [0u64; NR];
                            let mut ws = [zf; NR];
                            for j in 0..NR {
                                let v = F::quants(t.w.add(j * t.rb), p, t.nsub);
                                if signed {
                                    wneg[j] = _mm512_movepi8_mask(v);
                                    wq[j] = _mm512_abs_epi8(v);
                                } else if offset {
                                    wq[j] = _mm512_xor_si512(v, _mm512_set1_epi8(-128));
                                } else {
                                    wq[j] = v;
                                }
                                ws[j] = _mm512_permutexvar_ps(idx, gs[j]);
                            }
                            for (i, acc) in acc.iter_mut().enumerate() {
                                let xp = (t.i0 + i) * apairs + p;
                                let xq = _mm512_loadu_si512(q.add(xp * 2 * QK) as *const _);
                                let xd = _mm512_loadu_ps(dl.add(xp * 2 * LANES));
                                for j in 0..NR {
                                    let x = if signed {
                                        _mm512_mask_sub_epi8(xq, wneg[j], zero, xq)
                                    } else {
                                        xq
                                    };
                                    let d = _mm512_cvtepi32_ps($dot(wq[j], x));
                                    acc[j] = _mm512_fmadd_ps(d, _mm512_mul_ps(ws[j], xd), acc[j]);
                                }
                            }
                        }
                        g += 1;
                    }
                    for (i, acc) in acc.iter().enumerate() {
                        for (j, a) in acc.iter().enumerate() {
                            *t.out.add(i * t.ldo + j) = _mm512_reduce_add_ps(*a);
                        }
                    }
                }
            }
        };
    }

    packed512!(
        kp_vnni,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c",
        dot512_vnni,
        true
    );
    packed512!(
        kp_bw,
        "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c",
        dot512_bw,
        false
    );

    kernel256!(k256_vnni, "avx2,fma,f16c,avxvnni", dot256_vnni);
    kernel256!(k256_avx2, "avx2,fma,f16c", dot256_avx2);
}

#[cfg(test)]
mod tests;
