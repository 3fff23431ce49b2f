// Token sampling on the device with the CPU sampler's semantics (crates/engine-core/src/sampling):
// draws and prompt-token scores of one step, one block per job. The design, and what is exact
// and what is not, is described in crates/engine-cuda/src/sampler.rs.
//
// Nothing sorts the vocabulary. Candidates are ordered by an order-preserving 64-bit rank key
// (logit descending, then id ascending); every "where does the cumulative count or mass cross
// this target" question (top-k, top-p, typical-p, the draw, top-n) is answered by `locate`: a
// 16-way search over key intervals with per-thread histograms in shared memory (reduced in a
// fixed order: no float atomics), narrowing until at most SMP_CAP candidates are left, which
// are then sorted in shared memory and scanned. The row is re-read from global memory on every
// level (it stays in L2).
//
// A candidate's weight after temperature is f32 arithmetic with the CPU's bits (exp2_nonpositive:
// no library exp, no fused multiply-adds); the masses of the searches are summed in f64.
//
// A constrained draw's token mask (one bit per token) is folded into every read of its row:
// a masked token reads as -inf whatever its memory holds, so edits, lifted bans and the copy of
// a shared row never need to touch it, and each pass costs one extra mask word per 32 tokens.
#include "common.cuh"

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_DIGITS 16
// Candidates sorted in shared memory at the end of a search (and the largest top-n).
#define SMP_CAP 4096
// Dynamic shared memory: a level's histograms (16 × 512 × (8 + 4) bytes), or the survivors.
#define SMP_DYN_BYTES (SMP_DIGITS * SMP_THREADS * 12)

// Job flags (crates/engine-cuda/src/sampler.rs writes them).
#define JOB_GREEDY 1u
#define JOB_SCORE 2u
#define JOB_COPY 4u
#define JOB_BANS 8u
#define JOB_MASK 16u

// Edit kinds (sampling::processors::Edit).
#define EDIT_BIAS 0u
#define EDIT_REPETITION 1u
#define EDIT_SUBTRACT 2u
#define EDIT_BAN 3u

#define SMP_FLT_MAX 3.402823466e+38f
// 1.5 · 2^23: (t + SMP_ROUND) - SMP_ROUND rounds t to an integer.
#define SMP_ROUND 12582912.0f
#define SMP_ROUND_BITS 0x4b400000
// 2^f ≈ 1 + f·(C1 + f·(C2 + … + f·C6)) on [0, 1]: sampling::weight::EXP2_COEFFS, the same
// decimal literals (so the same f32s).
#define SMP_EXP2_C1 0.69314706f
#define SMP_EXP2_C2 0.24022931f
#define SMP_EXP2_C3 0.055485282f
#define SMP_EXP2_C4 0.009675452f
#define SMP_EXP2_C5 0.0012467847f
#define SMP_EXP2_C6 0.00021612915f
// Order key of -FLT_MAX: keys below it belong to -inf (and cleaned NaN).
#define KEY_FINITE_MIN 0x00800000u

#define CROSS_AT_LEAST 0
#define CROSS_ABOVE 1
#define SPACE_RANK 0
#define SPACE_TYPICAL 1

#ifdef LMI_EMU
#define SMP_BOUNDS
#define SMP_NO_UNROLL
#else
#define SMP_BOUNDS __launch_bounds__(SMP_THREADS, 1)
// For thread 0's boundary loops: unrolled, they raise the whole kernel's register count.
#define SMP_NO_UNROLL _Pragma("unroll 1")
#endif

// One draw or score; 72 bytes, written by the host. `scale` is log2(e) / temperature rounded
// to f32 (sampling::weight::scale); `mask_slot` indexes the uploaded masks (ceil(vocab / 32)
// words each) when JOB_MASK is set.
struct Job {
    unsigned row, flags, token, top_n, top_off, ops_off, ops_cnt, copy_slot;
    float min_p, top_p, typical_p;
    unsigned top_k;
    float scale;
    unsigned pad0;
    double u;
    unsigned mask_slot, pad;
};
static_assert(sizeof(Job) == 72, "JOB_BYTES in crates/engine-cuda/src/sampler.rs");

struct Shared {
    unsigned long long bnd[SMP_DIGITS];  // lower bound of each digit of a search level
    unsigned dcnt[SMP_DIGITS];
    double dmass[SMP_DIGITS];
    double red_d[32];
    double red_d2[33];
    float red_f[32];
    unsigned red_u[32];
    unsigned counter;
    unsigned long long bcast;
};

// ---- Values and keys -------------------------------------------------------------------------

// NaN counts as -inf, +inf as FLT_MAX (sampling::logprobs::clean).
__device__ __forceinline__ float clean(float x) {
    if (x != x) return LMI_NEG_INF;
    if (x == LMI_INF) return SMP_FLT_MAX;
    return x;
}

// Larger logit, larger key; -0 and +0 share one key (they compare equal on the CPU).
__device__ __forceinline__ unsigned order_key(float x) {
    const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Whether token i is allowed by `mask` (null: no constraint). In the row loops (i = tid + 512 k)
// a warp's 32 tokens share one mask word: one broadcast load per warp.
__device__ __forceinline__ bool allowed(const unsigned* __restrict__ mask, unsigned i) {
    return mask == nullptr || ((mask[i >> 5] >> (i & 31u)) & 1u);
}

// A cleaned logit, -inf when masked (sampling::apply_mask runs before every processor, so a
// masked token is -inf on the CPU whatever the edits do). Its row value is not even loaded.
__device__ __forceinline__ float logit(const float* row, const unsigned* __restrict__ mask,
                                       unsigned i) {
    return allowed(mask, i) ? clean(row[i]) : LMI_NEG_INF;
}

__device__ __forceinline__ float key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Logit descending, then id ascending, as one descending key.
__device__ __forceinline__ unsigned long long rank_key(unsigned key, unsigned id) {
    return ((unsigned long long)key << 32) | (unsigned long long)(~id);
}

// ---- Block reductions (every thread calls them; every thread gets the result) ---------------

__device__ __forceinline__ unsigned warp_sum_u(unsigned v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LMI_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ unsigned block_min_u(unsigned v, Shared& s) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(LMI_FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) s.red_u[warp] = v;
    __syncthreads();
    v = lane < SMP_WARPS ? s.red_u[lane] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(LMI_FULL_MASK, v, o));
    return v;
}

// Largest value, lowest id among equals.
__device__ __forceinline__ void warp_argmax(float& m, unsigned& a) {
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(LMI_FULL_MASK, m, o);
        const unsigned oa = __shfl_xor_sync(LMI_FULL_MASK, a, o);
        if (om > m || (om == m && oa < a)) {
            m = om;
            a = oa;
        }
    }
}

__device__ __forceinline__ void block_argmax(float& m, unsigned& a, Shared& s) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    warp_argmax(m, a);
    __syncthreads();
    if (lane == 0) {
        s.red_f[warp] = m;
        s.red_u[warp] = a;
    }
    __syncthreads();
    m = lane < SMP_WARPS ? s.red_f[lane] : LMI_NEG_INF;
    a = lane < SMP_WARPS ? s.red_u[lane] : 0xffffffffu;
    warp_argmax(m, a);
}

// Exclusive prefix sum in thread order (a fixed order: deterministic).
__device__ __forceinline__ double block_exclusive_scan(double v, Shared& s) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    double incl = v;
    for (unsigned o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(LMI_FULL_MASK, incl, o);
        if (lane >= o) incl += t;
    }
    double excl = __shfl_up_sync(LMI_FULL_MASK, incl, 1);
    if (lane == 0) excl = 0.0;
    __syncthreads();
    if (lane == 31) s.red_d[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const double w = lane < SMP_WARPS ? s.red_d[lane] : 0.0;
        double wi = w;
        for (unsigned o = 1; o < 32; o <<= 1) {
            const double t = __shfl_up_sync(LMI_FULL_MASK, wi, o);
            if (lane >= o) wi += t;
        }
        double we = __shfl_up_sync(LMI_FULL_MASK, wi, 1);
        if (lane == 0) we = 0.0;
        s.red_d2[lane] = we;
    }
    __syncthreads();
    return s.red_d2[warp] + excl;
}

// ---- Row statistics --------------------------------------------------------------------------

struct Stats {
    float max;         // largest cleaned logit (-inf: none finite)
    float min;         // smallest finite cleaned logit
    unsigned argmax;   // lowest id of the largest (0 when none is finite)
    double log_norm;   // ln Σ exp(x)
};

// One pass: argmax and an online log-sum-exp (f32 exponentials, f64 partial sums).
__device__ Stats row_stats(const float* row, const unsigned* __restrict__ mask, unsigned n,
                           Shared& s) {
    float m = LMI_NEG_INF, lo = LMI_INF;
    unsigned a = 0xffffffffu;
    double sum = 0.0;
    for (unsigned i = threadIdx.x; i < n; i += SMP_THREADS) {
        const float x = logit(row, mask, i);
        if (x > LMI_NEG_INF) lo = fminf(lo, x);
        if (x > m) {
            sum = sum * (double)expf(m - x) + 1.0;
            m = x;
            a = i;
        } else if (x > LMI_NEG_INF) {
            sum += (double)expf(x - m);
        }
    }
    const float mine = m;
    float bm = m;
    unsigned ba = a;
    block_argmax(bm, ba, s);
    const double scaled = mine > LMI_NEG_INF ? sum * exp((double)mine - (double)bm) : 0.0;
    const double total = block_sum(scaled, s.red_d);
    Stats st;
    st.max = bm;
    st.min = -block_max(-lo, s.red_f);
    st.argmax = bm > LMI_NEG_INF ? ba : 0u;
    st.log_norm = bm > LMI_NEG_INF ? (double)bm + log(total) : (double)LMI_NEG_INF;
    return st;
}

// sampling::logprobs::RowStats::logprob.
__device__ __forceinline__ float logprob(const Stats& st, float x, unsigned n) {
    if (st.max == LMI_NEG_INF) return (float)(-log((double)n));
    return (float)((double)x - st.log_norm);
}

// ---- Edits (processors) ----------------------------------------------------------------------

__device__ __forceinline__ float apply_edit(float x, unsigned kind, float v) {
    if (kind == EDIT_BIAS) return x + v;
    if (kind == EDIT_REPETITION) return x > 0.0f ? x / v : x * v;
    return x - v;  // EDIT_SUBTRACT
}

// `ops` are (id, kind, value) triples sorted by id, each id's edits in the CPU's order; the
// first op of each id applies them all. `saved` gets the value before a ban (for lifting).
// Masked tokens read as -inf anyway: they are skipped (a private copy does not hold them).
__device__ void apply_edits(float* row, const unsigned* __restrict__ mask,
                            const unsigned* __restrict__ ops, unsigned cnt, float* saved) {
    for (unsigned k = threadIdx.x; k < cnt; k += SMP_THREADS) {
        const unsigned id = ops[3 * k];
        if ((k > 0 && ops[3 * (k - 1)] == id) || !allowed(mask, id)) continue;
        float x = row[id];
        bool banned = false;
        for (unsigned j = k; j < cnt && ops[3 * j] == id; ++j) {
            const unsigned kind = ops[3 * j + 1];
            if (kind == EDIT_BAN)
                banned = true;
            else
                x = apply_edit(x, kind, __uint_as_float(ops[3 * j + 2]));
        }
        saved[k] = x;
        row[id] = banned ? LMI_NEG_INF : x;
    }
}

// Bans leave no finite logit: every edited token gets its value before the ban back (masked
// ones have no saved value and stay masked, as on the CPU).
__device__ void lift_bans(float* row, const unsigned* __restrict__ mask,
                          const unsigned* __restrict__ ops, unsigned cnt, const float* saved) {
    for (unsigned k = threadIdx.x; k < cnt; k += SMP_THREADS) {
        const unsigned id = ops[3 * k];
        if ((k > 0 && ops[3 * (k - 1)] == id) || !allowed(mask, id)) continue;
        row[id] = saved[k];
    }
}

// ---- Candidates ------------------------------------------------------------------------------

// The tokens still in play: allowed by the mask, finite, order key >= k0 (temperature underflow
// and min_p), rank key >= cut (top-k, top-p), and, once typical-p has run, a typical score
// <= s_max.
struct Cands {
    const unsigned* mask;  // null: no constraint
    float max, scale;  // the row's largest logit; log2(e) / temperature
    float xmin;  // the row's smallest finite logit: where the first search level starts
    unsigned k0;
    unsigned long long cut;
    bool typical;
    double total, ln_total, entropy, s_max;
    double s_hint;  // about the largest typical score: where the typical search's first level ends
};

// 2^t for t <= 0 in plain f32 arithmetic, operation for operation as
// sampling::weight::exp2_nonpositive computes it (same bits; see its docs): t = n + f with
// n = floor(t), 2^f by a degree-6 polynomial with positive coefficients (Horner, clamped to
// 2), 2^n through the exponent bits. 0 below -126 (and for NaN), 1 from 0 up; monotone.
// __fmul_rn / __fadd_rn are never contracted into FMAs, which would round differently.
__device__ __forceinline__ float exp2_nonpositive(float t) {
    if (!(t >= -126.0f)) return 0.0f;
    if (t >= 0.0f) return 1.0f;
    // m's low mantissa bits hold round(t); n = floor(t), as a float and as an integer.
    const float m = __fadd_rn(t, SMP_ROUND);
    const float r = __fsub_rn(m, SMP_ROUND);
    const bool up = r > t;
    const float n = up ? __fsub_rn(r, 1.0f) : r;
    const int ni = __float_as_int(m) - SMP_ROUND_BITS - (up ? 1 : 0);
    const float f = __fsub_rn(t, n);
    float p = SMP_EXP2_C6;
    p = __fadd_rn(SMP_EXP2_C5, __fmul_rn(f, p));
    p = __fadd_rn(SMP_EXP2_C4, __fmul_rn(f, p));
    p = __fadd_rn(SMP_EXP2_C3, __fmul_rn(f, p));
    p = __fadd_rn(SMP_EXP2_C2, __fmul_rn(f, p));
    p = __fadd_rn(SMP_EXP2_C1, __fmul_rn(f, p));
    p = __fadd_rn(1.0f, __fmul_rn(f, p));
    return __fmul_rn(fminf(p, 2.0f), __int_as_float((ni + 127) << 23));
}

// The unnormalized probability after temperature, 2^((x - max) · scale), with the CPU's bits
// (sampling::weight::weight).
__device__ __forceinline__ float weight(const Cands& c, float x) {
    return exp2_nonpositive(__fmul_rn(__fsub_rn(x, c.max), c.scale));
}

// HF TypicalLogitsWarper's score, as sampling::filters::typical computes it.
__device__ __forceinline__ double typical_score(const Cands& c, double w) {
    return fabs(-(log(w) - c.ln_total) - c.entropy);
}

__device__ __forceinline__ unsigned long long double_bits(double d) {
    return (unsigned long long)__double_as_longlong(d);
}

// Whether token i is a candidate whose key (in SPACE) lies in [lo, hi]; its key and weight
// (w, or w / total in the typical space; only computed when MASS or typical needs it).
template <int SPACE, bool MASS>
__device__ __forceinline__ bool candidate(const Cands& c, const float* row,
                                          unsigned i, unsigned long long lo,
                                          unsigned long long hi, unsigned long long& key,
                                          double& wt) {
    const float x = logit(row, c.mask, i);
    const unsigned k = order_key(x);
    if (k < c.k0) return false;
    const unsigned long long r = rank_key(k, i);
    if (r < c.cut) return false;
    if (SPACE == SPACE_RANK && (r < lo || r > hi)) return false;
    if (SPACE == SPACE_TYPICAL || c.typical) {
        const double w = (double)weight(c, x);
        const double sc = typical_score(c, w);
        if (c.typical && !(sc <= c.s_max)) return false;
        if (SPACE == SPACE_TYPICAL) {
            key = ~double_bits(sc);  // descending key = ascending score
            if (key < lo || key > hi) return false;
            wt = w / c.total;
            return true;
        }
        key = r;
        wt = w;
        return true;
    }
    key = r;
    wt = MASS ? (double)weight(c, x) : 1.0;
    return true;
}

// ---- Search ----------------------------------------------------------------------------------

__device__ __forceinline__ bool crosses(double mass, double target, int crossing) {
    return crossing == CROSS_AT_LEAST ? mass >= target : mass > target;
}

// Gathers the candidates with key in [lo, hi] (at most SMP_CAP) into shared memory, sorted by
// key descending then id ascending. Returns how many.
template <int SPACE, bool MASS>
__device__ unsigned gather_sorted(const Cands& c, const float* row, unsigned n,
                                  unsigned long long lo, unsigned long long hi,
                                  unsigned char* dyn, Shared& s) {
    unsigned long long* fkey = reinterpret_cast<unsigned long long*>(dyn);
    double* fw = reinterpret_cast<double*>(dyn + SMP_CAP * 8);
    unsigned* fid = reinterpret_cast<unsigned*>(dyn + SMP_CAP * 16);
    __syncthreads();  // the caller's readers of `dyn` are done
    if (threadIdx.x == 0) s.counter = 0;
    __syncthreads();
    for (unsigned i = threadIdx.x; i < n; i += SMP_THREADS) {
        unsigned long long key;
        double wt;
        if (!candidate<SPACE, MASS>(c, row, i, lo, hi, key, wt)) continue;
        const unsigned slot = atomicAdd(&s.counter, 1u);
        if (slot < SMP_CAP) {
            fkey[slot] = key;
            fw[slot] = wt;
            fid[slot] = i;
        }
    }
    __syncthreads();
    const unsigned p = min(s.counter, (unsigned)SMP_CAP);
    unsigned p2 = 1;
    while (p2 < p) p2 <<= 1;
    for (unsigned i = p + threadIdx.x; i < p2; i += SMP_THREADS) {
        fkey[i] = 0;
        fw[i] = 0.0;
        fid[i] = 0xffffffffu;
    }
    __syncthreads();
    // Bitonic sort; the atomic slots above are in no fixed order, the sorted result is.
    for (unsigned k = 2; k <= p2; k <<= 1) {
        for (unsigned j = k >> 1; j > 0; j >>= 1) {
            for (unsigned i = threadIdx.x; i < p2; i += SMP_THREADS) {
                const unsigned o = i ^ j;
                if (o <= i) continue;
                const bool o_first = fkey[o] > fkey[i] || (fkey[o] == fkey[i] && fid[o] < fid[i]);
                const bool i_first = fkey[i] > fkey[o] || (fkey[i] == fkey[o] && fid[i] < fid[o]);
                if ((i & k) == 0 ? o_first : i_first) {
                    const unsigned long long tk = fkey[i];
                    fkey[i] = fkey[o];
                    fkey[o] = tk;
                    const double tw = fw[i];
                    fw[i] = fw[o];
                    fw[o] = tw;
                    const unsigned ti = fid[i];
                    fid[i] = fid[o];
                    fid[o] = ti;
                }
            }
            __syncthreads();
        }
    }
    return p;
}

// Lower bounds of the 16 digits of a search level over [lo, hi] (nondecreasing, bnd[0] = lo).
// The first level of a rank search splits the logit range evenly (the top digits, where the
// mass and the first ranks are, then hold few candidates); other levels split the key range.
template <int SPACE>
__device__ void level_bounds(const Cands& c, unsigned long long lo, unsigned long long hi,
                             bool first, unsigned long long* bnd) {
    bnd[0] = lo;
    if (SPACE == SPACE_RANK && first) {
        const unsigned klo = (unsigned)(lo >> 32), khi = (unsigned)(hi >> 32);
        const double xlo = fmax((double)key_value(klo), (double)c.xmin);
        const double xhi = (double)key_value(khi);
        const double step = (xhi - xlo) / SMP_DIGITS;
        unsigned prev = klo;
        SMP_NO_UNROLL
        for (unsigned d = 1; d < SMP_DIGITS; ++d) {
            unsigned k = order_key((float)(xlo + step * d));
            k = k < prev ? prev : (k > khi ? khi : k);
            bnd[d] = k == klo ? lo : (unsigned long long)k << 32;
            prev = k;
        }
        return;
    }
    if (SPACE == SPACE_TYPICAL && first && c.s_hint > 0.0 && c.s_hint < (double)LMI_INF) {
        // Scores spread evenly over [0, s_hint]; anything above falls in digit 0 (only the
        // search's speed depends on the hint).
        SMP_NO_UNROLL
        for (unsigned d = 1; d < SMP_DIGITS; ++d)
            bnd[d] = ~double_bits(c.s_hint * (double)(SMP_DIGITS - d) / SMP_DIGITS);
        return;
    }
    const unsigned long long span = hi - lo;
    unsigned shift = 0;
    while ((span >> shift) > (unsigned long long)(SMP_DIGITS - 1)) ++shift;
    SMP_NO_UNROLL
    for (unsigned d = 1; d < SMP_DIGITS; ++d) {
        const unsigned long long off = (unsigned long long)d << shift;
        bnd[d] = off <= span ? lo + off : (hi == ~0ull ? hi : hi + 1);  // empty digit
    }
}

struct Found {
    bool crossed;
    unsigned long long key;
    unsigned id;
};

// The first candidate, in key-descending / id-ascending order within [lo, hi], at which the
// inclusive cumulative weight (counts when !MASS) crosses `target` (times the total weight when
// `fraction`). In mass mode a cumulative that never crosses (rounding) gives the last
// candidate, as on the CPU; in count mode it gives `crossed = false`, as does an empty set.
template <int SPACE, bool MASS>
__device__ Found locate(const Cands& c, const float* row, unsigned n,
                        unsigned long long lo, unsigned long long hi, double target,
                        bool fraction, int crossing, unsigned char* dyn, Shared& s) {
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    double* hmass = reinterpret_cast<double*>(dyn);
    unsigned* hcnt = reinterpret_cast<unsigned*>(dyn + SMP_DIGITS * SMP_THREADS * 8);
    Found f;
    f.crossed = false;
    f.key = 0;
    f.id = 0;
    double acc = 0.0;
    bool first = true, take_last = false;
    unsigned pop = 0;
    for (;;) {
        __syncthreads();  // the previous level's readers are done with bnd and the histograms
        if (tid == 0) level_bounds<SPACE>(c, lo, hi, first, s.bnd);
        __syncthreads();
        const unsigned long long* bnd = s.bnd;
        for (unsigned d = 0; d < SMP_DIGITS; ++d) {
            hcnt[d * SMP_THREADS + tid] = 0;
            if (MASS) hmass[d * SMP_THREADS + tid] = 0.0;
        }
        // Each thread owns one column of the histograms: no atomics, a fixed summation order.
        for (unsigned i = tid; i < n; i += SMP_THREADS) {
            unsigned long long key;
            double wt;
            if (!candidate<SPACE, MASS>(c, row, i, lo, hi, key, wt)) continue;
            unsigned d = 0;
            for (unsigned step = SMP_DIGITS / 2; step > 0; step >>= 1)
                if (key >= bnd[d + step]) d += step;
            hcnt[d * SMP_THREADS + tid] += 1;
            if (MASS) hmass[d * SMP_THREADS + tid] += wt;
        }
        __syncthreads();
        if (warp < SMP_DIGITS) {
            unsigned cs = 0;
            double ms = 0.0;
            for (unsigned t = lane; t < SMP_THREADS; t += 32) {
                cs += hcnt[warp * SMP_THREADS + t];
                if (MASS) ms += hmass[warp * SMP_THREADS + t];
            }
            cs = warp_sum_u(cs);
            if (MASS) ms = warp_sum(ms);
            if (lane == 0) {
                s.dcnt[warp] = cs;
                s.dmass[warp] = ms;
            }
        }
        __syncthreads();
        // Every thread walks the digits on the same values: block-uniform decisions.
        if (first) {
            first = false;
            double total = 0.0;
            unsigned count = 0;
            for (int d = SMP_DIGITS - 1; d >= 0; --d) {
                count += s.dcnt[d];
                total += MASS ? s.dmass[d] : (double)s.dcnt[d];
            }
            if (fraction) target *= total;
            if (count == 0 || (!MASS && total < target)) return f;
        }
        int sel = -1, lowest = -1;
        double a = acc, before_lowest = acc, before_sel = acc;
        for (int d = SMP_DIGITS - 1; d >= 0; --d) {
            if (s.dcnt[d] == 0) continue;
            const double m = MASS ? s.dmass[d] : (double)s.dcnt[d];
            if (!take_last && crosses(a + m, target, crossing)) {
                sel = d;
                before_sel = a;
                break;
            }
            lowest = d;
            before_lowest = a;
            a += m;
        }
        if (sel < 0) {
            take_last = true;
            sel = lowest;
            before_sel = before_lowest;
        }
        acc = before_sel;
        pop = s.dcnt[sel];
        if (sel < SMP_DIGITS - 1) hi = bnd[sel + 1] - 1;
        lo = bnd[sel];
        if (pop <= SMP_CAP || lo == hi) break;
    }
    if (pop > SMP_CAP) {
        // One typical score shared by more than SMP_CAP candidates: the score is the answer.
        f.crossed = true;
        f.key = lo;
        return f;
    }
    const unsigned p = gather_sorted<SPACE, MASS>(c, row, n, lo, hi, dyn, s);
    const unsigned long long* fkey = reinterpret_cast<const unsigned long long*>(dyn);
    const double* fw = reinterpret_cast<const double*>(dyn + SMP_CAP * 8);
    const unsigned* fid = reinterpret_cast<const unsigned*>(dyn + SMP_CAP * 16);
    // Each thread scans a contiguous chunk; chunks are combined by an exclusive scan.
    const unsigned chunk = (p + SMP_THREADS - 1) / SMP_THREADS;
    const unsigned begin = min(p, tid * chunk), end = min(p, begin + chunk);
    double local = 0.0;
    for (unsigned j = begin; j < end; ++j) local += fw[j];
    double run = acc + block_exclusive_scan(local, s);
    unsigned hit = 0xffffffffu;
    if (!take_last) {
        for (unsigned j = begin; j < end; ++j) {
            run += fw[j];
            if (crosses(run, target, crossing)) {
                hit = j;
                break;
            }
        }
    }
    hit = block_min_u(hit, s);
    if (hit >= p) hit = p - 1;
    f.crossed = true;
    f.key = fkey[hit];
    f.id = fid[hit];
    __syncthreads();  // everyone has read the survivors before `dyn` is reused
    return f;
}

// Σ weight over the candidates and, when ln_total is known, the entropy Σ -p ln p.
__device__ void mass_and_entropy(Cands& c, const float* row, unsigned n, Shared& s) {
    double total = 0.0;
    for (unsigned i = threadIdx.x; i < n; i += SMP_THREADS) {
        unsigned long long key;
        double w;
        if (candidate<SPACE_RANK, true>(c, row, i, 0ull, ~0ull, key, w)) total += w;
    }
    c.total = block_sum(total, s.red_d);
    c.ln_total = log(c.total);
    double h = 0.0;
    for (unsigned i = threadIdx.x; i < n; i += SMP_THREADS) {
        unsigned long long key;
        double w;
        if (!candidate<SPACE_RANK, true>(c, row, i, 0ull, ~0ull, key, w)) continue;
        const double lp = log(w) - c.ln_total;
        h += -exp(lp) * lp;
    }
    c.entropy = block_sum(h, s.red_d);
}

// Whether a logit with order key k survives temperature (w > 0) and min_p (w >= min_p).
__device__ __forceinline__ bool survives(const Cands& c, unsigned k, float min_w) {
    const float w = weight(c, key_value(k));
    return w > 0.0f && w >= min_w;
}

// The smallest order key in [KEY_FINITE_MIN, kmax] that survives (w is monotone in the logit),
// by a 32-way search on warp 0; kmax + 1 when kmax itself does not (unvalidated params).
__device__ unsigned cutoff_key(const Cands& c, unsigned kmax, float min_w, Shared& s) {
    if (threadIdx.x < 32) {
        const unsigned lane = threadIdx.x;
        unsigned long long lo = KEY_FINITE_MIN, hi = kmax;
        if (!survives(c, kmax, min_w)) {
            lo = (unsigned long long)kmax + 1;
        } else {
            while (hi > lo) {
                const unsigned long long step = (hi - lo) / 32 + 1;
                const unsigned long long probe = lo + lane * step + step - 1;
                const bool ok = probe >= hi || survives(c, (unsigned)probe, min_w);
                const unsigned b = __ballot_sync(LMI_FULL_MASK, ok);
                const unsigned f = (unsigned)(__ffs((int)b) - 1);
                const unsigned long long pf = lo + f * step + step - 1;
                const unsigned long long nlo = f == 0 ? lo : lo + f * step;
                hi = pf < hi ? pf : hi;
                lo = nlo;
            }
        }
        if (lane == 0) s.bcast = lo;
    }
    __syncthreads();
    const unsigned long long k0 = s.bcast;
    __syncthreads();
    return k0 > 0xffffffffull ? 0xffffffffu : (unsigned)k0;
}

// temperature → min_p → top_k → top_p → typical_p → inverse-CDF draw (sampling::filters).
__device__ unsigned draw(const Job& job, const float* row, const unsigned* __restrict__ mask,
                         unsigned n, const Stats& st, unsigned char* dyn, Shared& s) {
    Cands c;
    c.mask = mask;
    c.max = st.max;
    c.scale = job.scale;
    c.xmin = st.min;
    c.cut = 0;
    c.typical = false;
    c.total = c.ln_total = c.entropy = c.s_max = c.s_hint = 0.0;
    const unsigned kmax = order_key(st.max);
    c.k0 = cutoff_key(c, kmax, job.min_p, s);
    if (c.k0 > kmax) return st.argmax;
    const unsigned long long hi = rank_key(kmax, 0);
    unsigned long long lo = (unsigned long long)c.k0 << 32;
    if (job.top_k > 0) {
        const Found f = locate<SPACE_RANK, false>(c, row, n, lo, hi, (double)job.top_k, false,
                                                  CROSS_AT_LEAST, dyn, s);
        if (f.crossed) c.cut = lo = f.key;
    }
    if (job.top_p < 1.0f) {
        const Found f = locate<SPACE_RANK, true>(c, row, n, lo, hi, (double)job.top_p, true,
                                                 CROSS_AT_LEAST, dyn, s);
        c.cut = lo = f.key;
    }
    if (job.typical_p < 1.0f) {
        mass_and_entropy(c, row, n, s);
        // Scores are |ln total - ln w - H| with w between the lowest candidate's and 1.
        const float xlow = fmaxf(key_value((unsigned)(lo >> 32)), st.min);
        const double lw = log((double)weight(c, xlow));
        c.s_hint = fmax(fabs(c.ln_total - c.entropy), fabs(c.ln_total - lw - c.entropy));
        const Found f = locate<SPACE_TYPICAL, true>(c, row, n, 0ull, ~0ull, (double)job.typical_p,
                                                    false, CROSS_AT_LEAST, dyn, s);
        c.s_max = __longlong_as_double((long long)~f.key);
        c.typical = true;
    }
    const Found f = locate<SPACE_RANK, true>(c, row, n, lo, hi, job.u, true, CROSS_ABOVE, dyn, s);
    return f.crossed ? f.id : st.argmax;
}

// The `want` most probable tokens as (id, logprob) pairs, logprob descending, ids ascending
// among ties; tokens of probability zero are never listed. Returns how many were written.
__device__ unsigned top_n(const float* row, const unsigned* __restrict__ mask, unsigned n,
                          unsigned want, const Stats& st, unsigned* __restrict__ pairs,
                          unsigned char* dyn, Shared& s) {
    if (want == 0 || st.max == LMI_NEG_INF) return 0;
    Cands c;
    c.mask = mask;
    c.max = 0.0f;
    c.scale = 0.0f;
    c.xmin = st.min;
    c.k0 = KEY_FINITE_MIN;
    c.cut = 0;
    c.typical = false;
    c.total = c.ln_total = c.entropy = c.s_max = c.s_hint = 0.0;
    const unsigned long long lo = (unsigned long long)KEY_FINITE_MIN << 32;
    const unsigned long long hi = rank_key(order_key(st.max), 0);
    const Found f = locate<SPACE_RANK, false>(c, row, n, lo, hi, (double)want, false,
                                              CROSS_AT_LEAST, dyn, s);
    if (f.crossed) c.cut = f.key;
    const unsigned p = gather_sorted<SPACE_RANK, false>(c, row, n, c.cut > lo ? c.cut : lo, hi,
                                                        dyn, s);
    const unsigned* fid = reinterpret_cast<const unsigned*>(dyn + SMP_CAP * 16);
    const unsigned count = min(p, want);
    for (unsigned j = threadIdx.x; j < count; j += SMP_THREADS) {
        const unsigned id = fid[j];
        pairs[2 * j] = id;
        pairs[2 * j + 1] = __float_as_uint(logprob(st, logit(row, mask, id), n));
    }
    __syncthreads();
    return count;
}

// One block per job. `jobs`, `ops` and `masks` come from one upload; pointers that can reach a
// row or a saved value written in this kernel have no __restrict__ (it would allow the
// non-coherent read-only cache path for data the kernel modifies); `copies` holds a private row
// for every job flagged JOB_COPY, `saved` one float per op, `masks` ceil(vocab / 32) words per
// job flagged JOB_MASK (null when none is). `out` gets (token, logprob bits, top count, 0) per
// job, then the top-n pairs of every job at its top_off.
extern "C" __global__ SMP_BOUNDS void sampler_run(float* logits, unsigned vocab,
                                                  const Job* __restrict__ jobs,
                                                  const unsigned* __restrict__ ops,
                                                  const unsigned* __restrict__ masks,
                                                  float* copies, float* saved,
                                                  unsigned* __restrict__ out, unsigned n_jobs) {
    __shared__ Shared s;
    LMI_DYNAMIC_SHARED(unsigned char, dyn);
    const Job job = jobs[blockIdx.x];
    const unsigned* mask =
        (job.flags & JOB_MASK) ? masks + (unsigned long long)job.mask_slot * ((vocab + 31u) / 32u)
                               : nullptr;
    float* raw = logits + (unsigned long long)job.row * vocab;  // edited in place unless JOB_COPY
    float* work = raw;
    if (job.flags & JOB_COPY) {
        // Masked tokens are never read (see logit()): only the allowed ones are copied.
        work = copies + (unsigned long long)job.copy_slot * vocab;
        for (unsigned i = threadIdx.x; i < vocab; i += SMP_THREADS)
            if (allowed(mask, i)) work[i] = raw[i];
        __syncthreads();
    }
    const unsigned* my_ops = ops + 3ull * job.ops_off;
    float* my_saved = saved + job.ops_off;
    if (job.ops_cnt > 0) {
        apply_edits(work, mask, my_ops, job.ops_cnt, my_saved);
        __syncthreads();
    }
    Stats st = row_stats(work, mask, vocab, s);
    bool lifted = false;
    if (st.max == LMI_NEG_INF && (job.flags & JOB_BANS)) {
        lift_bans(work, mask, my_ops, job.ops_cnt, my_saved);
        __syncthreads();
        st = row_stats(work, mask, vocab, s);
        lifted = true;
    }
    unsigned token;
    if (job.flags & JOB_SCORE)
        token = job.token;
    else if ((job.flags & JOB_GREEDY) || lifted || st.max == LMI_NEG_INF)
        token = st.argmax;
    else
        token = draw(job, work, mask, vocab, st, dyn, s);
    unsigned* pairs = out + 4ull * n_jobs + 2ull * job.top_off;
    const unsigned count = top_n(work, mask, vocab, job.top_n, st, pairs, dyn, s);
    if (threadIdx.x == 0) {
        const float lp = token < vocab ? logprob(st, logit(work, mask, token), vocab) : LMI_NEG_INF;
        out[4 * blockIdx.x] = token;
        out[4 * blockIdx.x + 1] = __float_as_uint(lp);
        out[4 * blockIdx.x + 2] = count;
        out[4 * blockIdx.x + 3] = 0;
    }
}
