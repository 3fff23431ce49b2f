// The angle of rotate-half RoPE without f64 (see rope.cu): `rope_cos_sin`, shared by
// rope.cu and mla.cu.
#pragma once

// cos and sin of the angle `pos · step` (turns in 0.64 fixed point, see rope.cu).
__device__ __forceinline__ void rope_cos_sin(unsigned pos, unsigned long long step, float* c,
                                             float* s) {
    // The phase plus an eighth of a turn: its top two bits are the nearest quarter turn q,
    // the rest the remainder r in [-1/8, 1/8) turn, as a signed multiple of 2^-64 turn.
    const unsigned long long ph = (unsigned long long)pos * step + (1ull << 61);
    const unsigned q = (unsigned)(ph >> 62);
    const long long r = (long long)(ph & ((1ull << 62) - 1)) - (1ll << 61);
    // r = hi · 2^38 + lo · 2^14 (+ under 2^14, dropped: < 2^-50 turn), both exact in f32.
    const float hi = (float)(int)(r >> 38);               // [-2^23, 2^23)
    const float lo = (float)(int)((r >> 14) & 0xffffff);  // [0, 2^24)
    // x = 2π (hi · 2^-26 + lo · 2^-50), 2π · 2^-26 as a float-float pair: |x| <= π/4,
    // within an ulp of the exact angle.
    const float x = fmaf(hi, 0x1.921fb6p-24f, fmaf(hi, -0x1.777a5cp-49f, lo * 0x1.921fb6p-48f));
    const float z = x * x;
    const float sp = fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f);
    const float sx = fmaf(sp, z * x, x);
    const float cp = fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z,
                          4.166664568298827e-2f);
    const float cx = fmaf(cp, z * z, fmaf(-0.5f, z, 1.0f));
    // Rotate by q quarter turns: (cos, sin) of x + q·π/2.
    const float sn = (q & 1u) ? cx : sx, cs = (q & 1u) ? sx : cx;
    *s = (q & 2u) ? -sn : sn;
    *c = ((q + 1u) & 2u) ? -cs : cs;
}
