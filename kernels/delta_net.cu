// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) on the device, the CPU's
// engine-cpu/src/delta_net.rs step for step: per sequence a causal depthwise convolution over
// the [q k v] part of each token's fused projection (the last kernel - 1 inputs kept in the
// sequence's state slot), SiLU, q and k L2-normalized (q also by 1/sqrt(dk)); then per value
// head the delta rule over the head's dk × dv state S, token by token:
//   S ← e^g S;  delta = β (v − Sᵀk);  S += k ⊗ delta;  o = Sᵀq
// with β = σ(b) and g = −exp(A_log) · softplus(a + dt_bias); then o RMS-normalized over dv,
// times the norm's weight and silu(z).
//
// Four launches a layer (engine-cuda/src/delta_net.rs), each a fixed grid for a step's shape,
// so decode steps replay from CUDA graphs:
//   delta_conv         block (token, head of q, k or v): the convolution, SiLU, the L2 norms.
//                      Reads the slot's old inputs, never writes them.
//   delta_conv_state   block (sequence, 256 channels): the snapshots' and the slot's new
//                      convolution inputs (after delta_conv has read the old ones).
//   delta_rule_r*      block (sequence, value head, 32 columns of S): the recurrence.
//   delta_out_norm_*   block (token, value head): the gated RMSNorm.
//
// The recurrence runs in its recurrent form for prefill chunks and decode alike (one block per
// sequence, value head and 32 state columns, looping over the chunk's tokens): a token's
// output is then computed the same way however the prompt was cut into chunks and whatever
// else the step holds, and a snapshot may be taken after any token. The chunked (WY) form,
// faster for long prefills, is not implemented.
//
// Where the state slots are: the step upload (engine-cuda/src/step.rs) carries per sequence
// its slot (NO_SLOT: a padding sequence, or a step that holds no request: no state is read or
// written, outputs are those of a zero state), and its snapshots as (tokens, slot) pairs; a
// chunk whose first position is 0 starts from zeros. Slots are addressed through these device
// arrays, never through host pointers baked into a launch.
//
// State slot layout (f32): [conv_dim × (kernel − 1), oldest input first | nv × dk × dv].
// Batch invariance: no value depends on another sequence of the step; every reduction has a
// fixed order for a launch shape.
#include "common.cuh"

#define DN_NO_SLOT 0xffffffffu
// The widest convolution kernel (Qwen3.5 and Qwen3-Next use 4).
#define DN_MAX_KERNEL 8
// delta_rule: warps per block (the rows of S split among them), columns per block (a lane each).
#define DN_WARPS 8
#define DN_COLS 32

// σ(x), from exp(−|x|) so it never overflows.
__device__ __forceinline__ float dn_sigmoid(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// PyTorch's softplus (β 1, threshold 20), as the CPU's.
__device__ __forceinline__ float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Sequence `s`'s chunk: its first flat token, token count, slot, and whether it starts the
// sequence (its first position is 0: the state starts from zeros).
struct DnChunk {
    unsigned first, count, slot;
    bool fresh;
};

__device__ __forceinline__ DnChunk dn_chunk(unsigned s, const unsigned* __restrict__ seq_start,
                                            const unsigned* __restrict__ positions,
                                            const unsigned* __restrict__ slots) {
    DnChunk c;
    c.first = seq_start[s];
    c.count = seq_start[s + 1] - c.first;
    c.slot = slots[s];
    c.fresh = c.count == 0 || positions[c.first] == 0u;
    return c;
}

// Block (token blockIdx.x, segment blockIdx.y): segments 0 .. nk are the q heads, nk .. 2nk
// the k heads (dk channels each), then the nv value heads (dv channels each). out[t, c] =
// silu(Σ_i w[c, i] · x_{t − k1 + i}) over the channel's inputs, x_t the token's own (proj's
// first conv_dim values), the earlier ones the chunk's earlier tokens or, before the chunk,
// the slot's kept inputs (zeros for a fresh chunk or no slot). q and k heads are then
// L2-normalized (eps 1e-6 inside the root), q also scaled by 1/sqrt(dk). blockDim.x is a
// multiple of 32.
extern "C" __global__ void delta_conv(float* __restrict__ out, const float* __restrict__ proj,
                                      const float* __restrict__ states,
                                      const float* __restrict__ conv_w,
                                      const unsigned* __restrict__ token_seq,
                                      const unsigned* __restrict__ seq_start,
                                      const unsigned* __restrict__ positions,
                                      const unsigned* __restrict__ slots, unsigned proj_dim,
                                      unsigned conv_dim, unsigned kernel, unsigned nk,
                                      unsigned dk, unsigned dv, unsigned long long slot_len) {
    __shared__ float scratch[32];
    const unsigned t = blockIdx.x, seg = blockIdx.y;
    const DnChunk c = dn_chunk(token_seq[t], seq_start, positions, slots);
    const unsigned local = t - c.first, k1 = kernel - 1u;
    const bool has_past = c.slot != DN_NO_SLOT && !c.fresh;
    const float* kept = has_past ? states + (unsigned long long)c.slot * slot_len : states;
    unsigned begin, width;
    if (seg < 2u * nk) {
        begin = seg * dk;
        width = dk;
    } else {
        begin = 2u * nk * dk + (seg - 2u * nk) * dv;
        width = dv;
    }
    float* o = out + (unsigned long long)t * conv_dim;
    float ss = 0.0f;
    for (unsigned ch = begin + threadIdx.x; ch < begin + width; ch += blockDim.x) {
        const float* w = conv_w + (unsigned long long)ch * kernel;
        // The CPU's order: the token's own tap first, then the past oldest first.
        float acc = w[k1] * proj[(unsigned long long)t * proj_dim + ch];
        for (unsigned i = 0; i < k1; i++) {
            const unsigned back = k1 - i;  // this tap reads the input `back` tokens earlier
            float x;
            if (back <= local) {
                x = proj[(unsigned long long)(t - back) * proj_dim + ch];
            } else {
                // Kept input k1 − (back − local) of the slot (the last one is the latest).
                x = has_past ? kept[(unsigned long long)ch * k1 + (k1 - (back - local))] : 0.0f;
            }
            acc += w[i] * x;
        }
        const float y = acc * dn_sigmoid(acc);
        o[ch] = y;
        ss += y * y;
    }
    if (seg >= 2u * nk) return;  // block-uniform: value heads are not normalized
    ss = block_sum(ss, scratch);
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    const bool query = seg < nk;
    const float qs = 1.0f / sqrtf((float)dk);
    for (unsigned ch = begin + threadIdx.x; ch < begin + width; ch += blockDim.x) {
        const float y = o[ch] * inv;  // each thread rescales the values it wrote
        o[ch] = query ? y * qs : y;
    }
}

// Block (sequence blockIdx.x, channels blockIdx.y · blockDim.x ...): the convolution inputs
// after each snapshot's token count, into the snapshot's slot, and after the whole chunk,
// into the sequence's slot (kept inputs oldest first). Runs after delta_conv, which reads the
// slot's old inputs.
extern "C" __global__ void delta_conv_state(float* __restrict__ states,
                                            const float* __restrict__ proj,
                                            const unsigned* __restrict__ seq_start,
                                            const unsigned* __restrict__ positions,
                                            const unsigned* __restrict__ slots,
                                            const unsigned* __restrict__ snap_start,
                                            const unsigned* __restrict__ snaps,
                                            unsigned proj_dim, unsigned conv_dim,
                                            unsigned kernel, unsigned long long slot_len) {
    const unsigned s = blockIdx.x;
    const DnChunk c = dn_chunk(s, seq_start, positions, slots);
    const unsigned ch = blockIdx.y * blockDim.x + threadIdx.x;
    if (c.slot == DN_NO_SLOT || ch >= conv_dim) return;
    const unsigned k1 = kernel - 1u;
    float* own = states + (unsigned long long)c.slot * slot_len + (unsigned long long)ch * k1;
    float old[DN_MAX_KERNEL - 1];
#pragma unroll
    for (unsigned i = 0; i + 1 < DN_MAX_KERNEL; i++) old[i] = (i < k1 && !c.fresh) ? own[i] : 0.0f;
    // The last k1 inputs once `n` tokens of the chunk have run, into `dst`: input i (oldest
    // first) is the chunk's token n − k1 + i, or before the chunk the old input i + n (picked
    // by compile-time indices, so `old` stays in registers).
    auto kept_after = [&](unsigned n, float* dst) {
#pragma unroll
        for (unsigned i = 0; i + 1 < DN_MAX_KERNEL; i++) {
            if (i >= k1) break;
            if (i + n >= k1) {
                dst[i] = proj[(unsigned long long)(c.first + n + i - k1) * proj_dim + ch];
            } else {
                float v = 0.0f;
#pragma unroll
                for (unsigned m = 0; m + 1 < DN_MAX_KERNEL; m++) v = m == i + n ? old[m] : v;
                dst[i] = v;
            }
        }
    };
    for (unsigned p = snap_start[s]; p < snap_start[s + 1]; p++) {
        float* dst = states + (unsigned long long)snaps[2 * p + 1] * slot_len +
                     (unsigned long long)ch * k1;
        kept_after(snaps[2 * p], dst);
    }
    kept_after(c.count, own);
}

// The recurrence of sequence blockIdx.x, value head blockIdx.y (reading key head
// h / (nv / nk)), state columns blockIdx.z · 32 + lane: warp w holds rows w + 8r (r < R) of
// its lane's column in registers. Per token: the q and k rows staged in shared memory, S
// decayed, Sᵀk summed over the warps (shared memory, fixed order), S updated, Sᵀq summed the
// same way and written by warp 0 to raw[t, h · dv + column]. Snapshots copy S after their
// token; the chunk's S goes back to the slot. `dk <= 8 R`.
template <int R>
__device__ __forceinline__ void delta_rule(
    float* __restrict__ raw, float* __restrict__ states, const float* __restrict__ conv,
    const float* __restrict__ proj, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const unsigned* __restrict__ seq_start,
    const unsigned* __restrict__ positions, const unsigned* __restrict__ slots,
    const unsigned* __restrict__ snap_start, const unsigned* __restrict__ snaps,
    unsigned proj_dim, unsigned conv_dim, unsigned kernel, unsigned nk, unsigned nv, unsigned dk,
    unsigned dv, unsigned long long slot_len) {
    __shared__ float q_s[8 * R], k_s[8 * R], gate_s[2];
    __shared__ float red_k[DN_WARPS][DN_COLS], red_q[DN_WARPS][DN_COLS];
    const unsigned s = blockIdx.x, h = blockIdx.y;
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    const unsigned col = blockIdx.z * DN_COLS + lane;
    const bool live_col = col < dv;
    const DnChunk c = dn_chunk(s, seq_start, positions, slots);
    const unsigned vd = nv * dv, kh = h / (nv / nk), key_dim = nk * dk;
    if (c.slot == DN_NO_SLOT) {
        // No state: a zero output (the padding rows' out_proj must stay finite).
        for (unsigned t = 0; t < c.count; t++)
            if (w == 0 && live_col) raw[(unsigned long long)(c.first + t) * vd + h * dv + col] = 0.0f;
        return;
    }
    const unsigned long long matrix =
        (unsigned long long)(kernel - 1u) * conv_dim + (unsigned long long)h * dk * dv;
    float* own = states + (unsigned long long)c.slot * slot_len + matrix;
    float st[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const unsigned i = w + DN_WARPS * r;
        st[r] = (!c.fresh && live_col && i < dk) ? own[(unsigned long long)i * dv + col] : 0.0f;
    }
    const float decay = -expf(a_log[h]), bias = dt_bias[h];
    for (unsigned l = 0; l < c.count; l++) {
        const unsigned long long t = c.first + l;
        const float* x = conv + t * conv_dim;
        for (unsigned i = threadIdx.x; i < dk; i += blockDim.x) {
            q_s[i] = x[kh * dk + i];
            k_s[i] = x[key_dim + kh * dk + i];
        }
        if (threadIdx.x == 0) {
            const float* p = proj + t * proj_dim + conv_dim + vd;
            gate_s[0] = dn_sigmoid(p[h]);                             // β
            gate_s[1] = expf(decay * dn_softplus(p[nv + h] + bias));  // e^g
        }
        __syncthreads();
        const float beta = gate_s[0], e = gate_s[1];
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned i = w + DN_WARPS * r;
            st[r] *= e;
            if (i < dk) part += st[r] * k_s[i];
        }
        red_k[w][lane] = part;
        __syncthreads();
        float kv = 0.0f;
#pragma unroll
        for (int v = 0; v < DN_WARPS; v++) kv += red_k[v][lane];
        const float vj = live_col ? x[2u * key_dim + h * dv + col] : 0.0f;
        const float delta = (vj - kv) * beta;
        float oq = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned i = w + DN_WARPS * r;
            if (i < dk) {
                st[r] += k_s[i] * delta;
                oq += st[r] * q_s[i];
            }
        }
        red_q[w][lane] = oq;
        __syncthreads();
        if (w == 0 && live_col) {
            float o = 0.0f;
#pragma unroll
            for (int v = 0; v < DN_WARPS; v++) o += red_q[v][lane];
            raw[t * vd + h * dv + col] = o;
        }
        // Snapshots after this token (the list is short: the prefix cache's, per chunk).
        for (unsigned p = snap_start[s]; p < snap_start[s + 1]; p++) {
            if (snaps[2 * p] != l + 1u || !live_col) continue;
            float* dst = states + (unsigned long long)snaps[2 * p + 1] * slot_len + matrix;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned i = w + DN_WARPS * r;
                if (i < dk) dst[(unsigned long long)i * dv + col] = st[r];
            }
        }
    }
    if (!live_col) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const unsigned i = w + DN_WARPS * r;
        if (i < dk) own[(unsigned long long)i * dv + col] = st[r];
    }
}

// Grid (sequences, nv, ceil(dv / 32)), DN_WARPS warps; the suffix is R (dk <= 8 R).
#define DELTA_RULE(NAME, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * DN_WARPS) NAME(                            \
        float* __restrict__ raw, float* __restrict__ states, const float* __restrict__ conv,     \
        const float* __restrict__ proj, const float* __restrict__ a_log,                         \
        const float* __restrict__ dt_bias, const unsigned* __restrict__ seq_start,              \
        const unsigned* __restrict__ positions, const unsigned* __restrict__ slots,              \
        const unsigned* __restrict__ snap_start, const unsigned* __restrict__ snaps,             \
        unsigned proj_dim, unsigned conv_dim, unsigned kernel, unsigned nk, unsigned nv,         \
        unsigned dk, unsigned dv, unsigned long long slot_len) {                                 \
        delta_rule<R>(raw, states, conv, proj, a_log, dt_bias, seq_start, positions, slots,      \
                      snap_start, snaps, proj_dim, conv_dim, kernel, nk, nv, dk, dv, slot_len); \
    }
DELTA_RULE(delta_rule_r8, 8)
DELTA_RULE(delta_rule_r16, 16)
DELTA_RULE(delta_rule_r32, 32)

// Block (token blockIdx.x, value head blockIdx.y): out = raw / rms(raw) · w · silu(z) over the
// head's dv values, z the token's projection at conv_dim + h · dv. blockDim.x a multiple of 32.
template <typename TOut>
__device__ __forceinline__ void delta_out_norm(TOut* __restrict__ out,
                                               const float* __restrict__ raw,
                                               const float* __restrict__ proj,
                                               const float* __restrict__ w, unsigned proj_dim,
                                               unsigned conv_dim, unsigned nv, unsigned dv,
                                               float eps) {
    __shared__ float scratch[32];
    const unsigned long long t = blockIdx.x;
    const unsigned h = blockIdx.y;
    const float* o = raw + t * nv * dv + h * dv;
    const float* z = proj + t * proj_dim + conv_dim + h * dv;
    float ss = 0.0f;
    for (unsigned j = threadIdx.x; j < dv; j += blockDim.x) ss += o[j] * o[j];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
    for (unsigned j = threadIdx.x; j < dv; j += blockDim.x)
        store_f32(out, t * nv * dv + h * dv + j, o[j] * inv * w[j] * silu_mul_one(z[j], 1.0f));
}

#define DELTA_OUT_NORM(NAME, TOut)                                                            \
    extern "C" __global__ void NAME(TOut* __restrict__ out, const float* __restrict__ raw,   \
                                    const float* __restrict__ proj,                          \
                                    const float* __restrict__ w, unsigned proj_dim,          \
                                    unsigned conv_dim, unsigned nv, unsigned dv, float eps) { \
        delta_out_norm(out, raw, proj, w, proj_dim, conv_dim, nv, dv, eps);                  \
    }
DELTA_OUT_NORM(delta_out_norm_f32, float)
DELTA_OUT_NORM(delta_out_norm_bf16, bf16)

// Block (pair blockIdx.x, grid-stride over the slot): copies slot pairs[2p] to pairs[2p + 1]
// (forks, prefix hits). The host launches pairs that depend on each other in separate launches.
extern "C" __global__ void copy_state_slots(float* __restrict__ states,
                                            const unsigned* __restrict__ pairs,
                                            unsigned long long slot_len) {
    const float* src = states + (unsigned long long)pairs[2 * blockIdx.x] * slot_len;
    float* dst = states + (unsigned long long)pairs[2 * blockIdx.x + 1] * slot_len;
    for (unsigned long long i = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
         i < slot_len; i += (unsigned long long)gridDim.y * blockDim.x)
        dst[i] = src[i];
}

// x[i] *= σ(gate[i]): the gated attention's output gate; x f32 or bf16 (rounded once).
#define SIGMOID_MUL(NAME, T)                                                                  \
    extern "C" __global__ void NAME(T* __restrict__ x, const float* __restrict__ gate,       \
                                    unsigned long long n) {                                  \
        for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
             e < n; e += (unsigned long long)gridDim.x * blockDim.x)                         \
            store_f32(x, e, load_f32(x, e) * dn_sigmoid(gate[e]));                           \
    }
SIGMOID_MUL(sigmoid_mul_f32, float)
SIGMOID_MUL(sigmoid_mul_bf16, bf16)
