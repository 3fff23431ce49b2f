#!/usr/bin/env python3
"""Writes a gpt-oss-shaped GGUF with random weights for the mixture-of-experts benchmark
(tests/peers/quant_bench.py), laid out as llama.cpp's converter writes gpt-oss: experts in MXFP4
(as published), attention, embeddings and output in Q8_0, norms, biases, sinks and the router
in f32. Hidden 1024, 16 layers, 16 query and 4 KV heads of 64 with per-head sinks, a window of
128 tokens on even layers, YaRN as gpt-oss's, 32 experts of width 1024 with biases, 4 per
token: 1.8B parameters, 0.3B of them read per token. The tokenizer and its metadata are the
default model's (SmolLM2, 49152 tokens) so that both servers can tokenize.

  python3 -m pip install gguf numpy    # gguf 0.19 or newer (MXFP4)
  python3 tests/peers/make_gpt_oss_gguf.py --donor SmolLM2-135M-Instruct.Q4_1.gguf --out gpt-oss-mxfp4.gguf
"""
import argparse

import numpy as np
import gguf
from gguf.quants import quantize

from make_llama_1b_gguf import copy_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 1024, 16, 16, 4, 64
EXPERTS, USED, EXPERT_FF, WINDOW = 32, 4, 1024, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--donor", required=True, help="a GGUF whose tokenizer metadata is copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    donor = gguf.GGUFReader(a.donor)
    vocab = len(donor.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(a.out, "gpt-oss")
    w.add_name("gpt-oss-1.8b-a0.3b-shaped-random")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(EXPERT_FF)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(EXPERT_FF)
    w.add_sliding_window(WINDOW)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_vocab_size(vocab)
    copy_tokenizer(w, donor)
    rng = np.random.default_rng(a.seed)

    def quantized(name, qtype, *shape):
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        q = quantize(x, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    def f32(name, *shape, value=None, scale=0.0):
        if value is None:
            value = np.ones(shape, dtype=np.float32) if scale == 0.0 else (
                rng.standard_normal(shape, dtype=np.float32) * scale)
        w.add_tensor(name, value.astype(np.float32))

    q8, mx = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    quantized("token_embd.weight", q8, vocab, HIDDEN)
    quantized("output.weight", q8, vocab, HIDDEN)
    f32("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}"
        f32(f"{p}.attn_norm.weight", HIDDEN)
        f32(f"{p}.post_attention_norm.weight", HIDDEN)
        for name, rows in [("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM),
                           ("attn_v", KV_HEADS * HEAD_DIM)]:
            quantized(f"{p}.{name}.weight", q8, rows, HIDDEN)
            f32(f"{p}.{name}.bias", rows, scale=0.02)
        quantized(f"{p}.attn_output.weight", q8, HIDDEN, HEADS * HEAD_DIM)
        f32(f"{p}.attn_output.bias", HIDDEN, scale=0.02)
        f32(f"{p}.attn_sinks.weight", HEADS, scale=1.0)
        # The router in f32 as llama.cpp's converter keeps it; spread so tokens pick
        # different experts.
        f32(f"{p}.ffn_gate_inp.weight", EXPERTS, HIDDEN, scale=1.0)
        f32(f"{p}.ffn_gate_inp.bias", EXPERTS, scale=0.1)
        quantized(f"{p}.ffn_gate_exps.weight", mx, EXPERTS, EXPERT_FF, HIDDEN)
        quantized(f"{p}.ffn_up_exps.weight", mx, EXPERTS, EXPERT_FF, HIDDEN)
        quantized(f"{p}.ffn_down_exps.weight", mx, EXPERTS, HIDDEN, EXPERT_FF)
        f32(f"{p}.ffn_gate_exps.bias", EXPERTS, EXPERT_FF, scale=0.02)
        f32(f"{p}.ffn_up_exps.bias", EXPERTS, EXPERT_FF, scale=0.02)
        f32(f"{p}.ffn_down_exps.bias", EXPERTS, HIDDEN, scale=0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
