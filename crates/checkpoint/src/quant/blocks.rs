//! One block at a time: ggml's dequantization (`dequantize_row_*` in ggml-quants.c) and
//! simple quantizers that write the same layouts (round to nearest with the block's range:
//! not llama.cpp's search for the best scales, which matters for quality, not for layout).

use half::f16;

use super::QType;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn put_f16(out: &mut Vec<u8>, x: f32) -> f32 {
    let h = f16::from_f32(x);
    out.extend_from_slice(&h.to_le_bytes());
    h.to_f32()
}

/// Q4_K's 6-bit scale and min of sub-block `j` (ggml `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one block (`qtype.block()` values). `I8` blocks come out unscaled: the row's
/// scale is applied by the caller.
pub fn dequantize_block(qtype: QType, b: &[u8], out: &mut [f32]) {
    match qtype {
        QType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }
        QType::I8 => {
            for (o, &q) in out.iter_mut().zip(&b[..32]) {
                *o = f32::from(q as i8);
            }
        }
        QType::Q4_0 => {
            let d = f16_at(b, 0);
            for (j, &q) in b[2..18].iter().enumerate() {
                out[j] = (f32::from(q & 0x0f) - 8.0) * d;
                out[j + 16] = (f32::from(q >> 4) - 8.0) * d;
            }
        }
        QType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, &q) in b[4..20].iter().enumerate() {
                out[j] = f32::from(q & 0x0f) * d + m;
                out[j + 16] = f32::from(q >> 4) * d + m;
            }
        }
        QType::Q4_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (scales, qs) = (&b[4..16], &b[16..144]);
            for p in 0..4 {
                let (s1, m1) = scale_min_k4(2 * p, scales);
                let (s2, m2) = scale_min_k4(2 * p + 1, scales);
                let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
                let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
                for l in 0..32 {
                    let q = qs[32 * p + l];
                    out[64 * p + l] = d1 * f32::from(q & 0xf) - m1;
                    out[64 * p + 32 + l] = d2 * f32::from(q >> 4) - m2;
                }
            }
        }
        QType::MXFP4 => super::mxfp4::dequantize_ggml_block(b, out),
        QType::Q6_K => {
            let d = f16_at(b, 208);
            for h in 0..2 {
                let ql = &b[64 * h..64 * h + 64];
                let qh = &b[128 + 32 * h..128 + 32 * h + 32];
                let sc = &b[192 + 8 * h..192 + 8 * h + 8];
                let y = &mut out[128 * h..128 * h + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    let s = |i: usize| d * f32::from(sc[i] as i8);
                    y[l] = s(is) * q1 as f32;
                    y[l + 32] = s(is + 2) * q2 as f32;
                    y[l + 64] = s(is + 4) * q3 as f32;
                    y[l + 96] = s(is + 6) * q4 as f32;
                }
            }
        }
    }
}

/// Appends the blocks of one row (`x.len()` a multiple of the block) to `out`; returns the
/// row's scale for `I8`.
pub fn quantize_row(qtype: QType, x: &[f32], out: &mut Vec<u8>) -> Option<f32> {
    let b = qtype.block();
    match qtype {
        QType::I8 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            out.extend(
                x.iter()
                    .map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
            );
            return Some(d);
        }
        QType::Q8_0 => x.chunks_exact(b).for_each(|x| q8_0(x, out)),
        QType::Q4_0 => x.chunks_exact(b).for_each(|x| q4_0(x, out)),
        QType::Q4_1 => x.chunks_exact(b).for_each(|x| q4_1(x, out)),
        QType::Q4_K => x.chunks_exact(b).for_each(|x| q4_k(x, out)),
        QType::Q6_K => x.chunks_exact(b).for_each(|x| q6_k(x, out)),
        QType::MXFP4 => x
            .chunks_exact(b)
            .for_each(|x| super::mxfp4::quantize_ggml_block(x, out)),
    }
    None
}

fn inv(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = inv(put_f16(out, amax / 127.0));
    out.extend(
        x.iter()
            .map(|v| (v * id).round().clamp(-128.0, 127.0) as i8 as u8),
    );
}

fn q4_0(x: &[f32], out: &mut Vec<u8>) {
    // The value of largest magnitude maps to -8, as ggml does.
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let id = inv(put_f16(out, max / -8.0));
    let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
}

fn q4_1(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let id = inv(put_f16(out, (max - min) / 15.0));
    let m = put_f16(out, min);
    let q = |v: f32| (((v - m) * id).round() as i32).clamp(0, 15) as u8;
    out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
}

fn q4_k(x: &[f32], out: &mut Vec<u8>) {
    // Per sub-block of 32: x ≈ scale·q − min with q in 0..15, min ≥ 0.
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, s) in x.chunks_exact(32).enumerate() {
        let lo = s.iter().copied().fold(0f32, f32::min);
        let hi = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / 15.0;
        min[j] = -lo;
    }
    let max_scale = scale.iter().copied().fold(0f32, f32::max);
    let max_min = min.iter().copied().fold(0f32, f32::max);
    let d = put_f16(out, max_scale / 63.0);
    let dmin = put_f16(out, max_min / 63.0);
    let (id, idmin) = (inv(d), inv(dmin));
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        sc[j] = (scale[j] * id).round().clamp(0.0, 63.0) as u8;
        mn[j] = (min[j] * idmin).round().clamp(0.0, 63.0) as u8;
    }
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4);
    }
    out.extend_from_slice(&packed);
    let mut q = [0u8; 256];
    for j in 0..8 {
        let ds = d * f32::from(sc[j]);
        let dm = dmin * f32::from(mn[j]);
        let ids = inv(ds);
        for l in 0..32 {
            q[32 * j + l] = (((x[32 * j + l] + dm) * ids).round() as i32).clamp(0, 15) as u8;
        }
    }
    for p in 0..4 {
        out.extend((0..32).map(|l| q[64 * p + l] | (q[64 * p + 32 + l] << 4)));
    }
}

fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    // Per sub-block of 16: x ≈ scale·q with q in -32..31 (the largest magnitude maps to -32).
    let mut scale = [0f32; 16];
    for (j, s) in x.chunks_exact(16).enumerate() {
        let max = s
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        scale[j] = max / -32.0;
    }
    let amax = scale.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0).to_f32();
    let id = inv(d);
    let sc: Vec<i8> = scale
        .iter()
        .map(|s| (s * id).round().clamp(-128.0, 127.0) as i8)
        .collect();
    let mut q = [0u8; 256];
    for j in 0..16 {
        let ids = inv(d * f32::from(sc[j]));
        for l in 0..16 {
            let v = ((x[16 * j + l] * ids).round() as i32).clamp(-32, 31);
            q[16 * j + l] = (v + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for h in 0..2 {
        for l in 0..32 {
            let at = |o: usize| q[128 * h + o + l];
            let (q1, q2, q3, q4) = (at(0), at(32), at(64), at(96));
            ql[64 * h + l] = (q1 & 0xf) | ((q3 & 0xf) << 4);
            ql[64 * h + 32 + l] = (q2 & 0xf) | ((q4 & 0xf) << 4);
            qh[32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    put_f16(out, d);
}
