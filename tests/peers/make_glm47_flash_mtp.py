#!/usr/bin/env python3
"""Writes the GLM-4.7-Flash-shaped model of make_glm47_flash_gguf.py (1.4B, random weights) as
an HF directory (bf16 safetensors) with a multi-token-prediction layer as GLM-4.7-Flash
publishes it: `model.layers.12.*` (one more sparse decoder layer, drawn like the others) with
`eh_proj`, `enorm`, `hnorm`, `shared_head.norm`, and the head's own `embed_tokens` and
`shared_head.head` (copies of the model's), `num_nextn_predict_layers` 1. For the cost of the
engine's MTP draft head (issue 53: `option.speculative_mtp`): its layer is random, so its drafts
are rejected, and what a step pays for the head is what this model measures.

  /work/venv-t/bin/python tests/peers/make_glm47_flash_mtp.py \\
      --tokenizer ~/.cache/lmi/models/SmolLM2-135M-Instruct --out /tmp/glm-mtp
"""
import argparse
import json
import shutil
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

import make_glm47_flash_gguf as base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    out = a.out / "glm47-flash-1b-mtp-hf"
    out.mkdir(parents=True, exist_ok=True)
    layers = base.LAYERS
    c = base.config()
    # One more layer, drawn as the others: the MTP layer's decoder.
    c.num_hidden_layers = layers + 1
    c.mlp_layer_types = c.mlp_layer_types + ["sparse"]
    torch.manual_seed(0)
    model = transformers.Glm4MoeLiteForCausalLM(c).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.01 * torch.randn_like(p))
    model.save_pretrained(out)
    del model
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    cfg["mlp_layer_types"] = cfg["mlp_layer_types"][:layers]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    base.published(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    # The MTP layer's own tensors, in a shard of their own (as published).
    files = sorted(out.glob("model*.safetensors"))
    weights = {}
    for f in files:
        weights.update(load_file(f))
        f.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    h = c.hidden_size
    p = f"model.layers.{layers}."
    g = torch.Generator().manual_seed(1)
    mtp = {k: v for k, v in weights.items() if k.startswith(p)}
    main_ = {k: v for k, v in weights.items() if not k.startswith(p)}
    mtp[p + "eh_proj.weight"] = (0.02 * torch.randn(h, 2 * h, generator=g)).to(torch.bfloat16)
    for n in ["enorm", "hnorm", "shared_head.norm"]:
        mtp[p + n + ".weight"] = torch.ones(h, dtype=torch.bfloat16)
    mtp[p + "embed_tokens.weight"] = main_["model.embed_tokens.weight"].clone()
    mtp[p + "shared_head.head.weight"] = main_["lm_head.weight"].clone()
    save_file(main_, out / "model.safetensors", metadata={"format": "pt"})
    save_file(mtp, out / "model-mtp.safetensors", metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {**{k: "model.safetensors" for k in main_},
                                            **{k: "model-mtp.safetensors" for k in mtp}}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        if (a.tokenizer / f).exists():
            shutil.copy(a.tokenizer / f, out / f)
    print("wrote", out)


if __name__ == "__main__":
    main()
