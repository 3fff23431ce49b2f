"""Writes a random Llama-3-8B-shaped checkpoint (config.json + bf16 safetensors) for the GPU
benchmarks, with the standard library alone (no torch, no download): the device runbook makes
it on the device, and its rehearsal here makes a small one with the same code.

Weights: matrices with random signs and magnitudes in [2^-7, 2^-5) (about a normal(0, 0.02)
init's spread), norms at 1. Logits of such a model are near-uniform: it is for shapes and
speed, never for agreement (the runbook judges agreement on the default model's real weights).

Usage: make_random_llama.py OUT_DIR [--layers N] [--shape 8b|tiny] [--seed S]"""
import argparse
import json
import os
import random
import struct

SHAPES = {
    # Llama-3-8B.
    "8b": dict(vocab=128256, hidden=4096, intermediate=14336, heads=32, kv_heads=8),
    # The same proportions, small enough to rehearse on the fake driver.
    "tiny": dict(vocab=2048, hidden=256, intermediate=896, heads=4, kv_heads=2),
}

# The high byte of a little-endian bf16: sign (random) and the top 7 exponent bits. Exponents
# 120..122 (with the low byte's top bit, 120..123) put |x| in [2^-7, 2^-4).
HIGH_BYTE = bytes((b & 0x80) | (0x3C + (b & 0x01)) for b in range(256))


def random_bf16(count: int, rng: random.Random) -> bytes:
    data = bytearray(rng.randbytes(2 * count))
    data[1::2] = bytes(data[1::2]).translate(HIGH_BYTE)
    return bytes(data)


def ones_bf16(count: int) -> bytes:
    return struct.pack("<H", 0x3F80) * count


def write_safetensors(path: str, tensors: list) -> None:
    """tensors: [(name, shape, bytes)], written in order (the format: an 8-byte header size,
    a JSON header of dtypes, shapes and byte ranges, then the data)."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, _, data in tensors:
            f.write(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    rng = random.Random(a.seed)
    h, inter, hd = s["hidden"], s["intermediate"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * hd
    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s["vocab"],
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": a.layers,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": hd,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    def matrix(name, rows, cols):
        return (name, [rows, cols], random_bf16(rows * cols, rng))

    params = 0
    # One shard per 8 layers keeps each file's bytes in memory bounded (about 1.7 GB for 8b).
    shards, weight_map = [], {}
    groups = [list(range(i, min(i + 8, a.layers))) for i in range(0, a.layers, 8)] or [[]]
    for g, layers in enumerate(groups):
        tensors = []
        if g == 0:
            tensors.append(matrix("model.embed_tokens.weight", s["vocab"], h))
        for l in layers:
            p = f"model.layers.{l}."
            tensors += [
                (p + "input_layernorm.weight", [h], ones_bf16(h)),
                (p + "post_attention_layernorm.weight", [h], ones_bf16(h)),
                matrix(p + "self_attn.q_proj.weight", h, h),
                matrix(p + "self_attn.k_proj.weight", kv, h),
                matrix(p + "self_attn.v_proj.weight", kv, h),
                matrix(p + "self_attn.o_proj.weight", h, h),
                matrix(p + "mlp.gate_proj.weight", inter, h),
                matrix(p + "mlp.up_proj.weight", inter, h),
                matrix(p + "mlp.down_proj.weight", h, inter),
            ]
        if g == len(groups) - 1:
            tensors.append(("model.norm.weight", [h], ones_bf16(h)))
            tensors.append(matrix("lm_head.weight", s["vocab"], h))
        name = f"model-{g + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(os.path.join(a.out, name), tensors)
        for t, shape, _ in tensors:
            weight_map[t] = name
            n = 1
            for d in shape:
                n *= d
            params += n
        shards.append(name)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 2 * params}, "weight_map": weight_map}, f)
    print(f"wrote {a.out}: {params / 1e6:.1f}M parameters ({a.shape} shape, {a.layers} layers)")


if __name__ == "__main__":
    main()
