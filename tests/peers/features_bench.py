#!/usr/bin/env python3
"""Structured output and speculative decoding side by side with a peer (llama.cpp's
llama-server, built by ../shared/peers/setup.sh), through each server's /v1/completions.

  python3 tests/peers/features_bench.py --url http://127.0.0.1:PORT --kind lmi|llama [--prediction]

structured: 16 concurrent requests, 64 greedy tokens each, unconstrained (EOS ignored) and each
under its own JSON schema (lmi: response_format json_schema; llama-server: json_schema), whose
shortest document is longer than 64 tokens; aggregate tok/s = completion tokens / wall time.
rewrite: one request at a time (2 passages), greedy, the passage returned; end-to-end tok/s.
With --prediction (lmi only) the passage is sent as OpenAI's `prediction`. Prints RESULT json.
Standard library only.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse

PASSAGE = (
    "The harbour town woke slowly in the grey light of autumn. Fishermen checked their nets along "
    "the quay while the smell of fresh bread drifted from the bakery on the corner. The old "
    "lighthouse keeper, who had watched the sea for forty years, liked to say that the colour of "
    "the water told you everything about the weather to come. Children walked to school in pairs, "
    "their bright coats the only flashes of colour against the stone walls. At the town hall, the "
    "council had gathered to organise the winter festival, a tradition that had survived two wars "
    "and a great storm."
)


def schema(i):
    return {
        "type": "object",
        "properties": {
            f"batch_{i}": {"type": "string", "maxLength": 12},
            "records": {
                "type": "array",
                "minItems": 200,
                "items": {
                    "type": "object",
                    "properties": {
                        f"id_{i}": {"type": "integer", "minimum": 0, "maximum": 1000 + i},
                        "label": {"type": "string", "maxLength": 8 + i % 5},
                        "ok": {"type": "boolean"},
                        "kind": {"enum": [f"k{i}_{j}" for j in range(3 + i % 4)]},
                    },
                    "required": [f"id_{i}", "label", "ok", "kind"],
                    "additionalProperties": False,
                },
            },
        },
        "required": [f"batch_{i}", "records"],
        "additionalProperties": False,
    }


def post(url, body):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        c.close()


def structured(url, kind, constrained, clients=16, gen=64):
    out = [0] * clients

    def one(i):
        body = {"prompt": f"Record batch {i} as JSON:", "max_tokens": gen, "temperature": 0}
        if constrained:
            if kind == "lmi":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema(i)}}
            else:
                body["json_schema"] = schema(i)
        else:
            body["ignore_eos"] = True
        out[i] = post(url, body)["usage"]["completion_tokens"]

    t = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(out) / (time.time() - t)


def rewrite(url, prediction):
    tokens, secs, texts = 0, 0.0, []
    for p in (PASSAGE, PASSAGE.replace("harbour", "port")):
        body = {
            "prompt": f"Copy this passage exactly.\n\nPassage: {p}\n\nCopy: ",
            "max_tokens": 140,
            "temperature": 0,
        }
        if prediction:
            body["prediction"] = {"type": "content", "content": p}
        t = time.time()
        r = post(url, body)
        secs += time.time() - t
        tokens += r["usage"]["completion_tokens"]
        texts.append(r["choices"][0]["text"])
    return tokens / secs, texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--kind", choices=["lmi", "llama"], required=True)
    ap.add_argument("--prediction", action="store_true")
    ap.add_argument("--only", choices=["structured", "rewrite"])
    a = ap.parse_args()
    res = {"kind": a.kind}
    if a.only != "rewrite":
        structured(a.url, a.kind, False, clients=2, gen=8)  # warm-up
        res["plain_tok_s"] = structured(a.url, a.kind, False)
        res["constrained_tok_s"] = structured(a.url, a.kind, True)
        res["constrained_vs_plain"] = res["constrained_tok_s"] / res["plain_tok_s"]
    if a.only != "structured":
        res["rewrite_tok_s"], texts = rewrite(a.url, False)
        if a.prediction:
            res["rewrite_prediction_tok_s"], ptexts = rewrite(a.url, True)
            res["prediction_identical"] = ptexts == texts
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
