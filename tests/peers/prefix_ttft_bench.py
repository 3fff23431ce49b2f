#!/usr/bin/env python3
"""Time to first token with and without a prefix-cache hit on a long shared prefix, against a
running OpenAI-compatible server (`lmi serve`, llama-server): requests whose prompts (token ids)
share their first --prefix tokens and differ after, each asking for one token, timed end to end
(the prompt's prefill and one draw).

The first request computes everything (cold). On a model with linear-attention layers (Qwen3.5),
lmi keeps the recurrent state only where a prompt branched off a cached one, so the second
request also computes the prefix and leaves a snapshot there; the later ones resume from it.
Prints each request's time and RESULT json with the cold time, the median of the hits and
their ratio.

  python3 tests/peers/prefix_ttft_bench.py --url http://127.0.0.1:8080 --prefix 2048 --requests 6
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def complete(url, prompt, model):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if model:
        body["model"] = model
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        r.read()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--suffix", type=int, default=24)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--model", default=None)
    a = ap.parse_args()
    rng = random.Random(0)
    prefix = [rng.randrange(100, a.vocab) for _ in range(a.prefix)]
    times = []
    for i in range(a.requests):
        suffix = [rng.randrange(100, a.vocab) for _ in range(a.suffix)]
        t = complete(a.url, prefix + suffix, a.model)
        times.append(t)
        print(f"request {i}: {t * 1000:.0f} ms", flush=True)
    cold = times[0]
    hits = times[2:]
    out = {"prefix": a.prefix, "suffix": a.suffix, "cold_s": cold,
           "second_s": times[1] if len(times) > 1 else None,
           "hit_median_s": statistics.median(hits) if hits else None}
    if hits:
        out["speedup"] = cold / out["hit_median_s"]
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
