#!/usr/bin/env python3
"""The second, independent check of the GGUF fixtures that llama.cpp's converter wrote
(mixtures of experts, Gemma 3): llama.cpp's llama-server (built by ../shared/peers/setup.sh) loads
each `tests/fixtures/{moe,gemma3}/*/model.f32.gguf` and decodes greedily from the fixture's prompt
ids; its 32 tokens must be transformers' (from reference.json), as ours are
(crates/engine/tests/moe.rs, gemma3.rs).

  python3 tests/peers/gguf_fixture_check.py ~/.cache/lmi-peers/llama.cpp/bin/llama-server

Standard library only; exits non-zero on a mismatch.
"""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Divergences of llama.cpp (llama-cpp-python 0.3.36's) from transformers, measured 2026-11-29;
# ours match transformers on both (crates/engine/tests/moe.rs: 2.6e-6 and 4.3e-6 over all 46
# positions). Reported, not failed on.
KNOWN = {
    # Greedy token 20 (position 34) is transformers' second choice, 0.35 below its first: not a
    # near tie. Not YaRN (transformers with truncate=True, or without rope scaling, keeps all
    # 32), nor the window's cache (--swa-full), nor flash attention (-fa on and off agree); the
    # window itself decides from token 0 (transformers without it departs at once).
    "gpt_oss": "llama.cpp's gpt-oss differs from token 20",
    # From token 1; not investigated. ggml's MXFP4 dot product takes Q8_0 activations, whose
    # rounding is larger than this fixture's greedy margins (0.03), so probably that.
    "gpt_oss_mxfp4": "differs from token 1 (likely its 8-bit activations)",
}
GROUPS = ["moe", "gemma3"]
PORT = 8399


def complete(prompt, n):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "return_tokens": True,
            "ignore_eos": True, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def main():
    server = sys.argv[1]
    ok = True
    for gguf in [g for group in GROUPS for g in sorted((FIXTURES / group).glob("*/model.f32.gguf"))]:
        ref = json.loads((gguf.parent / "reference.json").read_text())
        proc = subprocess.Popen([server, "-m", str(gguf), "--port", str(PORT), "-t", "2", "-c", "256"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                    break
                except Exception:
                    time.sleep(0.5)
            tokens = complete(ref["prompt"], len(ref["greedy"]))
        finally:
            proc.terminate()
            proc.wait()
        same = tokens == ref["greedy"]
        known = KNOWN.get(gguf.parent.name)
        ok &= same or known is not None
        note = "" if same or known is None else f" (known: {known})"
        print(f"{gguf.parent.name}: llama.cpp's {len(tokens)} greedy tokens "
              f"{'equal' if same else 'DIFFER from'} transformers'{note}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
