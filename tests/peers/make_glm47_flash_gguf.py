#!/usr/bin/env python3
"""Writes a GLM-4.7-Flash-shaped model (multi-head latent attention + DeepSeek-style experts,
`Glm4MoeLiteForCausalLM`) of about 1.4B parameters with random weights as a GGUF, through
transformers (the model) and llama.cpp's own converter (the file), for the MLA benchmarks
(issue 53). GLM-4.7-Flash's attention as published: hidden 2048, 20 heads, q_lora_rank 768,
kv_lora_rank 512, qk_nope_head_dim 192, qk_rope_head_dim 64 (interleaved), v_head_dim 256;
12 layers (the first dense with MLP 10240, as published; 11 sparse), 16 routed experts of 768
(published: 64 of 1536), 4 a token, one shared expert, sigmoid routing with a correction bias,
routed scaling 1.8, untied embeddings. The tokenizer is the default model's (SmolLM2, 49152
tokens) so that both servers can tokenize; speed does not depend on the words. 1.41B
parameters, about 0.69B of them read for one token.

Per token and layer the cache holds the 512-wide latent plus the 64 rotary values (576); the
same model with ordinary attention would hold 20 heads × (256 key + 256 value) = 10240.

Writes OUT_DIR/glm47-flash-1b-q8_0.gguf (llama.cpp's converter, --outtype q8_0); re-quantize
to Q4_K with `lmi quantize OUT_DIR/glm47-flash-1b-q8_0.gguf OUT_DIR/glm47-flash-1b-q4_k.gguf
--type q4_k`.

  /work/venv-q/bin/python tests/peers/make_glm47_flash_gguf.py \\
      --llama ~/.cache/lmi-peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp \\
      --tokenizer ~/.cache/lmi/models/SmolLM2-135M-Instruct --out /tmp/glm
"""
import json
import tempfile
from pathlib import Path

import torch
import transformers

import hf_gguf

LAYERS = 12


def config():
    return transformers.Glm4MoeLiteConfig(
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=10240,
        moe_intermediate_size=768,
        num_hidden_layers=LAYERS,
        num_attention_heads=20,
        num_key_value_heads=20,
        q_lora_rank=768,
        kv_lora_rank=512,
        qk_nope_head_dim=192,
        qk_rope_head_dim=64,
        v_head_dim=256,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.8,
        mlp_layer_types=["dense"] + ["sparse"] * (LAYERS - 1),
        max_position_embeddings=202752,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def published(d: Path):
    """GLM-4.7-Flash's config.json form (what the converter and loaders read): flat
    `rope_theta`, `partial_rotary_factor`, `first_k_dense_replace`, `num_nextn_predict_layers`
    (none here: no MTP layers are written), `topk_method`."""
    c = json.loads((d / "config.json").read_text())
    rope = c.pop("rope_parameters")
    c["rope_theta"] = rope["rope_theta"]
    c["partial_rotary_factor"] = 1.0
    c["rope_scaling"] = None
    c["num_nextn_predict_layers"] = 0
    c["first_k_dense_replace"] = sum(t == "dense" for t in c["mlp_layer_types"])
    c["topk_method"] = "noaux_tc"
    c.pop("head_dim", None)
    c.pop("qk_head_dim", None)
    (d / "config.json").write_text(json.dumps(dict(sorted(c.items())), indent=2) + "\n")


def main():
    a = hf_gguf.parse_args("glm47-flash-1b-hf")
    torch.manual_seed(0)
    model = transformers.Glm4MoeLiteForCausalLM(config()).to(torch.bfloat16).eval()
    with torch.no_grad():
        # The routing bias starts at zero; a small spread makes it take part, as trained ones do.
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.01 * torch.randn_like(p))
    n = sum(p.numel() for p in model.parameters())
    print(f"{n / 1e9:.2f}B parameters")
    with tempfile.TemporaryDirectory(dir=a.out) as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        published(hf)
        del model
        hf_gguf.add_tokenizer(hf, a.tokenizer, a.keep_hf, a.out, "glm47-flash-1b-hf")
        hf_gguf.import_converter(a.llama)
        import conversion.glm as glm

        # GLM's vocabulary writer looks up GLM's own special tokens ([gMASK], <|user|>): the
        # plain GPT-2 writer (DeepSeek's) takes the byte-level vocabulary as it is.
        glm.Glm4MoeLiteModel.set_vocab = lambda self: self._set_vocab_gpt2()
        # The converter writes no `expert_gating_func`, and llama.cpp routes such a deepseek2
        # file by softmax unless it has GLM-4.7-Flash's 47 layers and 154880 tokens: say
        # sigmoid, as the model routes (lmi reads the key too, and routes GLM by sigmoid
        # without it).
        import gguf

        glm_params = glm.Glm4MoeLiteModel.set_gguf_parameters

        def set_gguf_parameters(self):
            glm_params(self)
            self.gguf_writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

        glm.Glm4MoeLiteModel.set_gguf_parameters = set_gguf_parameters
        hf_gguf.convert(a.llama, hf, a.out / "glm47-flash-1b-q8_0.gguf", "--no-mtp")


if __name__ == "__main__":
    main()
