#!/usr/bin/env python3
"""Writes a Llama-3.2-1B-shaped GGUF with random weights (Q8_0 matrices, f32 norms) for the
quantized-weights benchmark (tests/peers/quant_bench.py): hidden 2048, 16 layers, 32 query and
8 KV heads, MLP 8192, tied embeddings. The tokenizer and its metadata are the default model's
(SmolLM2, 49152 tokens) so that both servers can tokenize; speed does not depend on the words.
Re-quantize with `lmi quantize OUT.gguf OUT-q4_k.gguf --type q4_k`.

  python3 -m pip install gguf numpy
  python3 tests/peers/make_llama_1b_gguf.py --donor ~/.cache/lmi/models/SmolLM2-135M-Instruct.Q4_1.gguf --out llama1b-q8_0.gguf
"""
import argparse

import numpy as np
import gguf
from gguf.quants import quantize

HIDDEN, LAYERS, HEADS, KV_HEADS, FF = 2048, 16, 32, 8, 8192


def copy_tokenizer(w, donor):
    """The donor GGUF's `tokenizer.*` metadata into the writer `w`."""
    for key, field in donor.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(key, vals)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--donor", required=True, help="a GGUF whose tokenizer metadata is copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    donor = gguf.GGUFReader(a.donor)
    vocab = len(donor.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("llama-1b-shaped-random")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(vocab)
    copy_tokenizer(w, donor)
    rng = np.random.default_rng(a.seed)

    def mat(name, rows, cols):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        q = quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name):
        w.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    mat("token_embd.weight", vocab, HIDDEN)
    norm("output_norm.weight")
    hd = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"blk.{i}"
        norm(f"{p}.attn_norm.weight")
        norm(f"{p}.ffn_norm.weight")
        mat(f"{p}.attn_q.weight", HEADS * hd, HIDDEN)
        mat(f"{p}.attn_k.weight", KV_HEADS * hd, HIDDEN)
        mat(f"{p}.attn_v.weight", KV_HEADS * hd, HIDDEN)
        mat(f"{p}.attn_output.weight", HIDDEN, HEADS * hd)
        mat(f"{p}.ffn_gate.weight", FF, HIDDEN)
        mat(f"{p}.ffn_up.weight", FF, HIDDEN)
        mat(f"{p}.ffn_down.weight", HIDDEN, FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
