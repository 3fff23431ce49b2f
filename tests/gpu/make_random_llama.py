"""Writes a random Llama-3-8B-shaped checkpoint (bf16 safetensors + config.json) for the GPU
checks and benchmarks: no download needed. Usage: make_random_llama.py OUT_DIR [--layers N]."""
import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=a.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=128000,
        eos_token_id=128001,
    )
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="5GB")
    # The engine reads torch_dtype to keep the weights in bf16.
    path = os.path.join(a.out, "config.json")
    with open(path) as f:
        c = json.load(f)
    c["torch_dtype"] = "bfloat16"
    with open(path, "w") as f:
        json.dump(c, f, indent=2)
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
