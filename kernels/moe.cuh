// What kernels/moe.cu and kernels/moe_wmma.cu share: the layer's expert table and the tile
// list as the host writes and moe_sort fills them, the routing and activation codes, and the
// activation itself.
#pragma once

#include "common.cuh"

// The most experts a layer may have (32 per lane of moe_route's warp) and picks per row.
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOP_K 32

// Routing rules (crate::moe::Routing).
#define MOE_SOFTMAX_TOPK 0
#define MOE_SOFTMAX_TOPK_RENORM 1
#define MOE_TOPK_SOFTMAX 2
// A shared expert's weight: the sigmoid of its gate's logit (one "expert", top 1).
#define MOE_SIGMOID_GATE 3
// An ungated shared expert's weight (DeepSeek's shared_experts): 1.
#define MOE_ONE 4
// The most groups moe_route_sigmoid ranks (one per lane).
#define MOE_MAX_GROUPS 32

// Expert activations (crate::moe::ExpertActivation).
#define MOE_SILU 0
#define MOE_CLAMPED_SWIGLU 1
// Gemma 4's experts: gelu_tanh(g) · u.
#define MOE_GELU_TANH 2

// One expert as the host's table holds it (engine-cuda/src/moe.rs writes four addresses per expert).
struct MoeExpert {
    const bf16* gate_up;         // [2 · width, hidden]: gate rows, then up rows
    const bf16* down;            // [hidden, width]
    const float* gate_up_bias;   // [2 · width], or null
    const float* down_bias;      // [hidden], or null
};

// Up to a tile's rows (moe_sort's tile_rows: 8 for moe.cu's products, 16 for moe_wmma.cu's)
// of consecutive assignments (in sorted order) of one expert; count 0: unused.
struct MoeTile {
    unsigned expert;
    unsigned start;
    unsigned count;
    unsigned pad_;
};

__device__ __forceinline__ bf16 moe_bf16(float v) { return f32_to_bf16(v); }
__device__ __forceinline__ bf16 moe_bf16(bf16 v) { return v; }

__device__ __forceinline__ float moe_activate(float g, float u, unsigned activation, float alpha,
                                              float limit) {
    if (activation == MOE_CLAMPED_SWIGLU) {
        // gpt-oss: min(g, limit) · σ(alpha · that) · (clamp(u, ±limit) + 1), the CPU's formula.
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return g * (1.0f / (1.0f + expf(-alpha * g))) * (u + 1.0f);
    }
    if (activation == MOE_GELU_TANH) {
        // gelu_pytorch_tanh(g) · u, kernels/activation.cu's formula.
        const float t = tanhf(0.7978846f * (g + 0.044715f * g * g * g));
        return 0.5f * g * (1.0f + t) * u;
    }
    return silu_mul_one(g, u);
}
