#!/usr/bin/env python3
"""Quantized GGUF weights side by side with llama.cpp's llama-server (built by
../shared/peers/setup.sh): each GGUF is served by both servers in turn, as it is, and driven
the same way through /v1/completions by ../shared/peers/openai_bench.py.

  python3 tests/peers/quant_bench.py --lmi target/release/lmi \
      --llama ~/.cache/lmi-peers/llama.cpp/bin/llama-server --gguf A.gguf [--gguf B.gguf] \
      [--lmi-variant 'lmi bf16=--dtype bf16'] [--lmi-variant 'lmi int8=LMI_CPU_NO_LANES=1'] \
      [--rounds 3] [--prompt-len 1024]

Per server and file: batch-1 decode tok/s (64-token prompt, or --prompt-len, 128 greedy
tokens, median of 3),
prefill tok/s (one 512-token prompt, 1 token: prompt / time to first token, median of 3),
aggregate tok/s of 16 and 64 concurrent streams (prompts as for batch 1, 128 tokens each,
end to end, prefill included), and resident
memory (VmRSS after the runs, VmHWM peak). With --rounds N every server runs N times, in
turn: the table gives each figure's median, and each ratio is the median of the rounds' own
ratios (their range in brackets). Prints a markdown table and RESULT json.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "shared", "peers"))
import bench_common as bc  # noqa: E402
import openai_bench as ob  # noqa: E402


def wait_ready(url, path, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not ready")


def mem(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024  # MiB
    return out


def prefill(client, pool, n_tokens, reps=3):
    rates = []
    for i in range(reps):
        # Seeds no other run uses: a prompt made from the same seed starts with the same
        # words, and a server's prefix cache would skip them.
        prompt = bc.make_prompts(pool, 1, n_tokens, seed=9000 + i)[0]
        rec = {}
        client.stream_completion(prompt, 1, rec)
        ttft = rec["times"][0] - rec["t_submit"]
        rates.append(n_tokens / ttft)
    return sorted(rates)[len(rates) // 2]


def start(kind, a, gguf, port):
    log = open(f"/tmp/quant-bench-{kind.replace(' ', '_')}-{port}.log", "w")
    if kind == "llama":
        # Its context is split evenly between the 64 slots: room for a prompt and 128 tokens.
        ctx = 64 * max(768, a.prompt_len + 256)
        cmd = [a.llama, "-m", gguf, "-t", "2", "-tb", "2", "-np", "64", "-cb", "-c", str(ctx),
               "--port", str(port), "--no-webui"]
        env = os.environ.copy()
    else:
        # A variant's words: KEY=VALUE (upper case) sets the environment, the rest are arguments.
        extra = a.variants.get(kind, [])
        setenv = dict(w.split("=", 1) for w in extra if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
        extra = [w for w in extra if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
        cmd = [a.lmi, "serve", "--model", gguf, "--port", str(port), "--host", "127.0.0.1"] + extra
        env = dict(os.environ, OPTION_MAX_ROLLING_BATCH_SIZE="64", RUST_LOG="warn", **setenv)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(f"http://127.0.0.1:{port}", "/health" if kind == "llama" else "/ping", proc)
    return proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmi", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--gguf", action="append", required=True)
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every server this many times, in turn (llama, lmi, ..., then "
                    "again): figures are medians, ratios the median of each round's ratio, so "
                    "a shared machine's drift falls on both sides")
    ap.add_argument("--prompt-len", type=int, default=64,
                    help="prompt tokens of the batch-1 and concurrent runs (a long one weighs "
                    "attention)")
    ap.add_argument("--lmi-variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also serve with these lmi serve arguments, e.g. "
                    "'lmi bf16=--dtype bf16'; words KEY=VALUE set the environment instead, "
                    "e.g. 'lmi int8=LMI_CPU_NO_LANES=1'")
    a = ap.parse_args()
    a.variants = {}
    for v in a.lmi_variant:
        name, _, args = v.partition("=")
        a.variants[name] = args.split()
    conc = [int(c) for c in a.concurrency.split(",")]
    pool = bc.word_pool(bc.default_gguf())
    rows = []
    for rnd, gguf in [(r, g) for r in range(a.rounds) for g in a.gguf]:
        size = os.path.getsize(gguf) / 2**20
        for kind in ["llama", "lmi"] + list(a.variants):
            proc = start(kind, a, gguf, a.port)
            try:
                client = ob.Client(f"http://127.0.0.1:{a.port}")
                quiet = lambda *x, **k: None  # noqa: E731
                r = {"file": os.path.basename(gguf), "file_mib": round(size), "server": kind,
                     "round": rnd}
                single = ob.run(client, a.prompt_len, 128, 1, 3, mode="single", log=quiet)
                r["b1"] = single["batch1"]["decode_tok_s_median"]
                r["prefill"] = prefill(client, pool, 512)
                for c in conc:
                    res = ob.run(client, a.prompt_len, 128, c, 1, mode="concurrent", warmup=False, log=quiet)
                    r[f"c{c}"] = res["concurrent"]["e2e_agg_tok_s"]
                r.update(mem(proc.pid))
                rows.append(r)
                print(json.dumps(r), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            time.sleep(2)
    cols = ["b1", "prefill"] + [f"c{c}" for c in conc]
    med = statistics.median
    print("\n| file | server | " + " | ".join(cols) + " | RSS MiB | peak MiB |")
    print("|---|---|" + "---:|" * (len(cols) + 2))
    keys = list(dict.fromkeys((r["file"], r["server"]) for r in rows))
    for f, kind in keys:
        runs = [r for r in rows if (r["file"], r["server"]) == (f, kind)]
        print(f"| {f} ({runs[0]['file_mib']} MiB) | {kind} | "
              + " | ".join(f"{med([r[c] for r in runs]):.0f}" for c in cols)
              + f" | {max(r['VmRSS'] for r in runs):.0f} | {max(r['VmHWM'] for r in runs):.0f} |")

    def ratio(f, num, den):
        # Each round's ratio, then their median (and range when there are several rounds).
        by_round = {}
        for r in rows:
            if r["file"] == f:
                by_round.setdefault(r["round"], {})[r["server"]] = r
        per = [[p[num][c] / p[den][c] for c in cols] for p in by_round.values()
               if num in p and den in p]
        cells = []
        for i in range(len(cols)):
            v = [q[i] for q in per]
            cells.append(f"{med(v):.2f}x" + (f" ({min(v):.2f}–{max(v):.2f})" if len(v) > 1 else ""))
        return f"| {f} | {num} / {den} | " + " | ".join(cells) + " | | |"

    for f in dict.fromkeys(r["file"] for r in rows):
        servers = list(dict.fromkeys(r["server"] for r in rows if r["file"] == f))
        for kind in [k for k in servers if k != "llama"]:
            if "llama" in servers:
                print(ratio(f, kind, "llama"))
            for other in [k for k in servers if k not in ("llama", kind) and kind == "lmi"]:
                print(ratio(f, "lmi", other))
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
