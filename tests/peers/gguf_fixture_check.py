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
        ok &= same
        print(f"{gguf.parent.name}: llama.cpp's {len(tokens)} greedy tokens "
              f"{'equal' if same else 'DIFFER from'} transformers'")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
