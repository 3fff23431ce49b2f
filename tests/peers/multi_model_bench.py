#!/usr/bin/env python3
"""Several models in one `lmi serve` (issue 54): the three goals, measured on one machine.

  python3 tests/peers/multi_model_bench.py --lmi target/release/lmi \
      [--gguf ~/.cache/lmi/models/SmolLM2-135M-Instruct.Q4_1.gguf] \
      [--rss-gguf /work/bench55/llama1b-q4_k.gguf] [--rounds 2] [--streams 16]

(a) throughput: aggregate tok/s of --streams concurrent streamed completions (64-token
    prompts, 128 greedy tokens, end to end) on --gguf served alone, and on the same file
    served under two names (`--model a=G --model b=G`) with only one of them busy (a, then
    b). Goal: each within 10% of alone. Servers alternate round by round; each ratio is the
    median of the rounds' own ratios (the ratio's range in brackets).
(b) memory: VmRSS of a server holding --gguf (warmed up) before --rss-gguf is registered
    (DJL `POST /models?url=…&model_name=extra`), after it is loaded and used (one round of
    streams), and after `DELETE /models/extra`; --cycles times in the same process.
    Goal: after-unload within 5% of before.
(c) loading on demand: time to first token of one streamed completion naming --gguf's
    model in a server started with `option.models_dir` holding only that file (nothing
    loaded: the request loads it), against a cold `lmi serve --model G` (process start to
    the first token of the same request, retried until the server answers). Goal: within
    1.2x. Medians of --rounds.

Prints a markdown table and RESULT json. --quick: tiny inputs (8 tokens, 4 streams) to check
the driver end to end against a debug binary.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "shared", "peers"))
import bench_common as bc  # noqa: E402
import openai_bench as ob  # noqa: E402
from quant_bench import mem, wait_ready  # noqa: E402

quiet = lambda *x, **k: None  # noqa: E731


def launch(a, args, tag):
    log = open(f"/tmp/multi-model-bench-{tag}-{a.port}.log", "w")
    cmd = [a.lmi, "serve", "--port", str(a.port), "--host", "127.0.0.1"] + args
    env = dict(os.environ, OPTION_MAX_ROLLING_BATCH_SIZE="64", RUST_LOG="warn")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def start(a, args, tag):
    proc = launch(a, args, tag)
    wait_ready(f"http://127.0.0.1:{a.port}", "/ping", proc)
    return proc


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    time.sleep(1)


def client(a, model):
    return ob.Client(f"http://127.0.0.1:{a.port}", model=model)


def streams(a, model):
    """Aggregate tok/s of a.streams concurrent streams on `model`."""
    res = ob.run(client(a, model), a.prompt_len, a.gen, a.streams, 1, mode="concurrent",
                 warmup=False, log=quiet)
    return res["concurrent"]["e2e_agg_tok_s"]


def warm(a, model):
    c = client(a, model)
    rec = c.stream_completion(" hello there friend", 4, {})
    if "error" in rec:
        raise RuntimeError(f"warm-up on {model}: {rec['error']}")


def throughput(a):
    rows = []
    for rnd in range(a.rounds):
        proc = start(a, ["--model", a.gguf], f"alone{rnd}")
        try:
            warm(a, "default")
            alone = statistics.median(streams(a, "default") for _ in range(a.reps))
        finally:
            stop(proc)
        proc = start(a, ["--model", f"a={a.gguf}", "--model", f"b={a.gguf}"], f"two{rnd}")
        try:
            warm(a, "a")
            warm(a, "b")
            two = {m: statistics.median(streams(a, m) for _ in range(a.reps)) for m in "ab"}
        finally:
            stop(proc)
        r = {"round": rnd, "alone": alone, "a": two["a"], "b": two["b"]}
        rows.append(r)
        print(json.dumps({"throughput": r}), flush=True)
    return rows


def http(a, method, path):
    c = client(a, "x")._conn()
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def settle_rss(pid, secs=3.0):
    """VmRSS after a few quiet seconds (freed pages go back asynchronously)."""
    time.sleep(secs)
    return mem(pid)["VmRSS"]


def memory(a):
    proc = start(a, ["--model", a.gguf], "rss")
    cycles = []
    try:
        warm(a, "default")
        streams(a, "default")
        before0 = settle_rss(proc.pid)
        q = urllib.parse.urlencode({"url": a.rss_gguf, "model_name": "extra"})
        for cyc in range(a.cycles):
            before = settle_rss(proc.pid, 1.0)
            st, body = http(a, "POST", f"/models?{q}")
            if st != 200:
                raise RuntimeError(f"registering extra: HTTP {st}: {body[:300]}")
            warm(a, "extra")
            streams(a, "extra")
            loaded = settle_rss(proc.pid)
            st, body = http(a, "DELETE", "/models/extra")
            if st != 200:
                raise RuntimeError(f"unregistering extra: HTTP {st}: {body[:300]}")
            after = settle_rss(proc.pid)
            c = {"cycle": cyc, "before": before, "loaded": loaded, "after": after,
                 "after_vs_first_before": after / before0}
            cycles.append(c)
            print(json.dumps({"memory": c}), flush=True)
    finally:
        stop(proc)
    return {"before": before0, "cycles": cycles}


def first_token(a, model, prompt, t0, deadline_s=600):
    """Seconds from t0 to the first token of a streamed completion, retried (every 5 ms)
    while the server does not answer yet or answers that it is loading."""
    c = client(a, model)
    end = time.perf_counter() + deadline_s
    while True:
        rec = c.stream_completion(prompt, 8, {})
        if "error" not in rec and rec["times"]:
            return rec["times"][0] - t0
        if time.perf_counter() > end:
            raise RuntimeError(f"no first token: {rec.get('error')}")
        time.sleep(0.005)


def load_ttft(a):
    pool = bc.word_pool(bc.default_gguf())
    name = os.path.splitext(os.path.basename(a.gguf))[0]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.abspath(a.gguf), os.path.join(d, os.path.basename(a.gguf)))
        # One cold start first, unmeasured: the file in the page cache for both.
        stop(start(a, ["--model", a.gguf], "cold-warmup"))
        for rnd in range(a.rounds):
            prompt = bc.make_prompts(pool, 1, a.prompt_len, seed=5000 + rnd)[0]
            t0 = time.perf_counter()
            proc = launch(a, ["--model", a.gguf], f"cold{rnd}")
            try:
                cold = first_token(a, name, prompt, t0)
            finally:
                stop(proc)
            proc = start(a, ["-o", f"option.models_dir={d}"], f"ondemand{rnd}")
            try:
                st, body = http(a, "GET", "/v1/models")
                if f'"{name}"' not in body or "UNLOADED" not in body:
                    raise RuntimeError(f"expected {name} listed, unloaded: {body[:300]}")
                t0 = time.perf_counter()
                on_demand = first_token(a, name, prompt, t0)
            finally:
                stop(proc)
            r = {"round": rnd, "cold_start_s": cold, "on_demand_s": on_demand}
            rows.append(r)
            print(json.dumps({"load": r}), flush=True)
    return rows


def spread(v):
    med = statistics.median(v)
    return f"{med:.2f}" + (f" ({min(v):.2f}–{max(v):.2f})" if len(v) > 1 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lmi", required=True)
    ap.add_argument("--gguf", default=bc.default_gguf())
    ap.add_argument("--rss-gguf", default=None,
                    help="the model registered and unregistered for (b) (default: --gguf)")
    ap.add_argument("--port", type=int, default=8392)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="runs of (a)'s streams per server")
    ap.add_argument("--cycles", type=int, default=2, help="register/unregister cycles of (b)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--only", default="a,b,c", help="which goals to measure")
    ap.add_argument("--quick", action="store_true", help="tiny inputs: checks the driver")
    a = ap.parse_args()
    a.rss_gguf = os.path.abspath(a.rss_gguf or a.gguf)
    if a.quick:
        a.streams, a.prompt_len, a.gen, a.rounds, a.cycles = 4, 8, 8, 1, 1
    only = set(a.only.split(","))
    out = {"gguf": os.path.basename(a.gguf), "rss_gguf": os.path.basename(a.rss_gguf),
           "streams": a.streams, "prompt_len": a.prompt_len, "gen": a.gen}
    if "a" in only:
        out["throughput"] = throughput(a)
    if "b" in only:
        out["memory"] = memory(a)
    if "c" in only:
        out["load"] = load_ttft(a)

    print("\n| goal | measured | ratio | goal met |\n|---|---|---:|---|")
    if "throughput" in out:
        rows = out["throughput"]
        alone = statistics.median(r["alone"] for r in rows)
        for m in "ab":
            ratios = [r[m] / r["alone"] for r in rows]
            ok = statistics.median(ratios) >= 0.9
            print(f"| (a) {a.streams} streams on `{m}` of two loaded vs alone, tok/s | "
                  f"{statistics.median(r[m] for r in rows):.0f} vs {alone:.0f} | "
                  f"{spread(ratios)}x | {'yes' if ok else 'no'} (≥ 0.90x) |")
    if "memory" in out:
        mm = out["memory"]
        for c in mm["cycles"]:
            ratio = c["after"] / c["before"]
            print(f"| (b) cycle {c['cycle']}: VmRSS before / loaded / after unload, MiB | "
                  f"{c['before']:.0f} / {c['loaded']:.0f} / {c['after']:.0f} | "
                  f"{ratio:.3f}x | {'yes' if ratio <= 1.05 else 'no'} (≤ 1.05x) |")
    if "load" in out:
        rows = out["load"]
        ratios = [r["on_demand_s"] / r["cold_start_s"] for r in rows]
        ok = statistics.median(ratios) <= 1.2
        print(f"| (c) TTFT, on-demand load vs cold start, s | "
              f"{spread([r['on_demand_s'] for r in rows])} vs "
              f"{spread([r['cold_start_s'] for r in rows])} | {spread(ratios)}x | "
              f"{'yes' if ok else 'no'} (≤ 1.2x) |")
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
