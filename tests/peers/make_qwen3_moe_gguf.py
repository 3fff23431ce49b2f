#!/usr/bin/env python3
"""Writes a Qwen3-MoE-shaped GGUF with random weights (Q8_0 matrices, f32 norms and router) for
the mixture-of-experts benchmark (tests/peers/quant_bench.py): hidden 1024, 16 layers, 16 query
and 4 KV heads of 64, 64 experts of MLP width 512, 8 per token, tied embeddings: 1.7B
parameters, 0.2B of them read per token. The tokenizer and its metadata are the default
model's (SmolLM2, 49152 tokens) so that both servers can tokenize. Re-quantize with
`lmi quantize OUT.gguf OUT-q4_k.gguf --type q4_k`.

  python3 -m pip install gguf numpy
  python3 tests/peers/make_qwen3_moe_gguf.py --donor SmolLM2-135M-Instruct.Q4_1.gguf --out moe-q8_0.gguf
"""
import argparse

import numpy as np
import gguf
from gguf.quants import quantize

from make_llama_1b_gguf import copy_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 1024, 16, 16, 4, 64
EXPERTS, USED, EXPERT_FF = 64, 8, 512


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--donor", required=True, help="a GGUF whose tokenizer metadata is copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    donor = gguf.GGUFReader(a.donor)
    vocab = len(donor.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(a.out, "qwen3moe")
    w.add_name("qwen3-moe-1.7b-a0.2b-shaped-random")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(EXPERT_FF)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(vocab)
    copy_tokenizer(w, donor)
    rng = np.random.default_rng(a.seed)

    def quantized(name, *shape):
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        q = quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def f32(name, *shape, value=None):
        x = np.ones(shape, dtype=np.float32) if value is None else value
        w.add_tensor(name, x)

    quantized("token_embd.weight", vocab, HIDDEN)
    f32("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}"
        f32(f"{p}.attn_norm.weight", HIDDEN)
        f32(f"{p}.ffn_norm.weight", HIDDEN)
        f32(f"{p}.attn_q_norm.weight", HEAD_DIM)
        f32(f"{p}.attn_k_norm.weight", HEAD_DIM)
        quantized(f"{p}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        quantized(f"{p}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        quantized(f"{p}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        quantized(f"{p}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        # The router in f32 as llama.cpp's converter and quantizer keep it; spread so tokens
        # pick different experts.
        router = rng.standard_normal((EXPERTS, HIDDEN), dtype=np.float32)
        f32(f"{p}.ffn_gate_inp.weight", EXPERTS, HIDDEN, value=router)
        quantized(f"{p}.ffn_gate_exps.weight", EXPERTS, EXPERT_FF, HIDDEN)
        quantized(f"{p}.ffn_up_exps.weight", EXPERTS, EXPERT_FF, HIDDEN)
        quantized(f"{p}.ffn_down_exps.weight", EXPERTS, HIDDEN, EXPERT_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
