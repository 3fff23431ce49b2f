#!/usr/bin/env python3
"""Writes a Gemma-4-shaped text model (`Gemma4ForCausalLM`) of about 1B parameters with random
weights as a GGUF, through transformers (the model) and llama.cpp's own converter (the file),
for the Gemma 4 benchmarks (issue 53): hidden 2048, 18 layers, five local (sliding window 512)
to one global, 8 query heads; the local layers 2 KV heads of 256 with RoPE θ 10k, the global
ones heads of 512 (`global_head_dim`), K = V (`attention_k_eq_v`) with one KV head
(`num_global_key_value_heads`) and "proportional" RoPE over a quarter of each head at θ 1M;
QK-norm, GeGLU MLP 6144, final logit soft-capping 30, tied embeddings (the dense layout of
gemma-4-31B, scaled down; no per-layer embeddings, no shared K/V). The tokenizer is the
default model's (SmolLM2, 49152 tokens) so that both servers can tokenize; speed does not depend
on the words. 0.98B parameters.

Writes OUT_DIR/gemma4-1b-q8_0.gguf (llama.cpp's converter, --outtype q8_0); re-quantize to Q4_K
with `lmi quantize OUT_DIR/gemma4-1b-q8_0.gguf OUT_DIR/gemma4-1b-q4_k.gguf --type q4_k`.

  /work/venv-q/bin/python tests/peers/make_gemma4_1b_gguf.py \\
      --llama ~/.cache/lmi-peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp \\
      --tokenizer ~/.cache/lmi/models/SmolLM2-135M-Instruct --out /tmp/g4
"""
import json
import tempfile
from pathlib import Path

import torch
import transformers

import hf_gguf

S, F = "sliding_attention", "full_attention"
LAYERS = 18
GLOBAL_HEAD_DIM = 512
GLOBAL_KV_HEADS = 1


def config():
    return transformers.Gemma4TextConfig(
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        global_head_dim=GLOBAL_HEAD_DIM,
        num_global_key_value_heads=GLOBAL_KV_HEADS,
        attention_k_eq_v=True,
        layer_types=[F if (i + 1) % 6 == 0 else S for i in range(LAYERS)],
        sliding_window=512,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10_000.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0},
        },
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=30.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def published(d: Path):
    """The published checkpoints' form of the text config: `global_head_dim` and
    `num_global_key_value_heads` rather than the `per_layer_config` transformers 5.25 writes."""
    c = json.loads((d / "config.json").read_text())
    c.pop("per_layer_config", None)
    c["global_head_dim"] = GLOBAL_HEAD_DIM
    c["num_global_key_value_heads"] = GLOBAL_KV_HEADS
    (d / "config.json").write_text(json.dumps(dict(sorted(c.items())), indent=2) + "\n")


def main():
    a = hf_gguf.parse_args("gemma4-1b-hf")
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(config()).to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"{n / 1e9:.2f}B parameters")
    with tempfile.TemporaryDirectory(dir=a.out) as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        published(hf)
        # Reads back to the same layer shapes (the global layers' heads, K = V).
        back = transformers.AutoConfig.from_pretrained(hf)
        glob = back.per_layer_config[back.layer_types.index(F)]
        assert (glob.head_dim, glob.num_key_value_heads) == (GLOBAL_HEAD_DIM, GLOBAL_KV_HEADS)
        del model
        hf_gguf.add_tokenizer(hf, a.tokenizer, a.keep_hf, a.out, "gemma4-1b-hf")
        hf_gguf.import_converter(a.llama)
        import conversion.gemma as gemma

        # Gemma 4's vocabulary writer reads a SentencePiece-style vocabulary: the byte-level
        # one goes through the plain GPT-2 writer.
        gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()
        hf_gguf.convert(a.llama, hf, a.out / "gemma4-1b-q8_0.gguf")


if __name__ == "__main__":
    main()
