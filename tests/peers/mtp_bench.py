#!/usr/bin/env python3
"""What the engine's MTP draft head costs (issue 53): one model with a multi-token-prediction
layer (e.g. make_glm47_flash_mtp.py's) served by lmi with the head (`option.speculative_mtp`,
on by default on the CPU) and without it, in turn, driven as quant_bench.py drives servers:
batch-1 decode tok/s (64-token prompt, 128 greedy tokens, median of 3) and the aggregate tok/s
of 4 concurrent streams (end to end). With a random MTP layer every draft is rejected: the
difference is the head's cost (its layer over every row, the rejected drafts' rows until a
sequence stops drafting).

  python3 tests/peers/mtp_bench.py --lmi target/release/lmi --model DIR [--rounds 2]
"""
import argparse
import json
import signal
import statistics
import subprocess
import time

import quant_bench as qb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmi", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8393)
    a = ap.parse_args()
    a.prompt_len = 64
    a.variants = {"lmi mtp": [], "lmi no mtp": ["-o", "option.speculative_mtp=false"]}
    rows = []
    for rnd in range(a.rounds):
        for kind in a.variants:
            proc = qb.start(kind, a, a.model, a.port)
            try:
                client = qb.ob.Client(f"http://127.0.0.1:{a.port}")
                quiet = lambda *x, **k: None  # noqa: E731
                single = qb.ob.run(client, 64, 128, 1, 3, mode="single", log=quiet)
                conc = qb.ob.run(client, 64, 128, 4, 1, mode="concurrent", warmup=False, log=quiet)
                r = {"server": kind, "round": rnd,
                     "b1": single["batch1"]["decode_tok_s_median"],
                     "c4": conc["concurrent"]["e2e_agg_tok_s"]}
                with open(f"/proc/{proc.pid}/status") as f:
                    r["VmRSS_MiB"] = next(int(x.split()[1]) // 1024 for x in f if x.startswith("VmRSS"))
                rows.append(r)
                print(json.dumps(r), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            time.sleep(2)
    print("\n| server | batch 1 tok/s | 4 streams tok/s | RSS MiB |")
    print("|---|---:|---:|---:|")
    for kind in a.variants:
        rs = [r for r in rows if r["server"] == kind]
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {kind} | {med('b1'):.1f} | {med('c4'):.1f} | {max(r['VmRSS_MiB'] for r in rs)} |")


if __name__ == "__main__":
    main()
