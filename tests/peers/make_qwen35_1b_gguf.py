#!/usr/bin/env python3
"""Writes a Qwen3.5-shaped model of about 1B parameters with random weights as a GGUF, through
transformers (the model) and llama.cpp's own converter (the file), for the hybrid benchmarks
(issue 51): hidden 2048, 16 layers (every fourth full attention: 12 Gated DeltaNet layers, 4
gated-attention layers with 8 query / 2 KV heads of 256 and a quarter of each head rotated),
16 key and 16 value heads of 128 in the linear layers, MLP 6144, tied embeddings. The
tokenizer is the default model's (SmolLM2, 49152 tokens) so that both servers can tokenize;
speed does not depend on the words. 1.01B parameters.

Writes OUT_DIR/qwen35-1b-q8_0.gguf (llama.cpp's converter, --outtype q8_0); re-quantize to Q4_K
with `lmi quantize OUT_DIR/qwen35-1b-q8_0.gguf OUT_DIR/qwen35-1b-q4_k.gguf --type q4_k`.

  /work/venv-q/bin/python tests/peers/make_qwen35_1b_gguf.py \\
      --llama ~/.cache/lmi-peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp \\
      --tokenizer ~/.cache/lmi/models/SmolLM2-135M-Instruct --out /tmp/q35
"""
import tempfile
from pathlib import Path

import torch
import transformers

import hf_gguf


def config():
    return transformers.Qwen3_5TextConfig(
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                         "partial_rotary_factor": 0.25},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


def main():
    a = hf_gguf.parse_args("qwen35-1b-hf")
    torch.manual_seed(0)
    cfg = config()
    model = transformers.Qwen3_5ForCausalLM(cfg).to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"{n / 1e9:.2f}B parameters")
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        del model
        hf_gguf.add_tokenizer(hf, a.tokenizer, a.keep_hf, a.out, "qwen35-1b-hf")
        hf_gguf.import_converter(a.llama)
        hf_gguf.convert(a.llama, hf, a.out / "qwen35-1b-q8_0.gguf", "--no-mtp")


if __name__ == "__main__":
    main()
