"""lm-eval (`lm_eval` from PyPI) with its `local-completions` model scores a multiple-choice task
defined in tests/clients/lm_eval_tasks from local files (no dataset download) through
/v1/completions prompt logprobs. Each choice's loglikelihood must equal the server's own
`decoder_input_details` for the same text, and the accuracy lm-eval reports must be the one
those figures give.

lm-eval needs a tokenizer to count the context's tokens: the default model's own
`tokenizer.json` in the model cache, read by `transformers` (no torch)."""

import glob
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

TASK_DIR = Path(__file__).parent / "lm_eval_tasks"
TASK = "lmi_capitals"


def model_dir():
    cache = os.environ.get("LMI_MODEL_CACHE") or os.path.expanduser("~/.cache/lmi/models")
    d = Path(cache) / "SmolLM2-135M-Instruct"
    if not (d / "tokenizer.json").exists():
        pytest.fail(f"the default model's tokenizer is not in {d}: the server imports it at start")
    return d


def server_loglikelihood(url, context, continuation):
    """Sum of the continuation's prompt logprobs after the context, from LMI's
    decoder_input_details, and its token count (context tokenized alone by TGI's /tokenize)."""
    ctx = requests.post(f"{url}/tokenize", json={"inputs": context}, timeout=60)
    assert ctx.status_code == 200, ctx.text
    n_ctx = len(ctx.json())
    r = requests.post(f"{url}/invocations", json={
        "inputs": context + continuation,
        "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True},
    }, timeout=300)
    assert r.status_code == 200, r.text
    prefill = r.json()["details"]["prefill"]
    assert [t["id"] for t in prefill[:n_ctx]] == [t["id"] for t in ctx.json()], (
        "the continuation changed the context's tokens")
    return sum(t["log_prob"] for t in prefill[n_ctx:]), len(prefill) - n_ctx


def test_lm_eval_local_completions_scores_choices_as_the_server_does(url, tmp_path):
    env = dict(
        os.environ,
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        TOKENIZERS_PARALLELISM="false",
    )
    model_args = ",".join([
        f"base_url={url}/v1/completions",
        "model=SmolLM2-135M-Instruct",
        "tokenizer_backend=huggingface",
        f"tokenizer={model_dir()}",
        "max_retries=1",
    ])
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "lm_eval",
        "--model", "local-completions",
        "--model_args", model_args,
        # Four prompts per request, as token-id lists (the server's max_client_batch_size).
        "--batch_size", "4",
        "--include_path", str(TASK_DIR),
        "--tasks", TASK,
        "--log_samples",
        "--output_path", str(out),
    ]
    # data_files in the task are relative to the task's folder.
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=TASK_DIR, env=env)
    assert r.returncode == 0, f"lm_eval failed:\n{r.stdout[-5000:]}\n{r.stderr[-5000:]}"

    (samples_path,) = glob.glob(str(out / "**" / f"samples_{TASK}_*.jsonl"), recursive=True)
    samples = [json.loads(line) for line in open(samples_path)]
    docs = [json.loads(line) for line in open(TASK_DIR / f"{TASK}.jsonl")]
    assert len(samples) == len(docs)
    correct = 0
    for s in samples:
        args = [s["arguments"][f"gen_args_{i}"] for i in range(len(s["arguments"]))]
        assert len(args) == len(docs[s["doc_id"]]["choices"])
        ours = []
        for a, resp in zip(args, s["filtered_resps"]):
            context, continuation = a["arg_0"], a["arg_1"]
            lm_eval_ll = float(resp[0])
            ll, n = server_loglikelihood(url, context, continuation)
            assert n >= 1
            # Batching may change the last bits of a float32 sum; nothing more.
            assert math.isclose(lm_eval_ll, ll, abs_tol=2e-3), (
                f"{continuation!r} after {context!r}: lm-eval {lm_eval_ll}, server {ll}")
            ours.append(ll)
        best = max(range(len(ours)), key=lambda i: ours[i])
        correct += best == int(s["target"])

    (results_path,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    acc = json.load(open(results_path))["results"][TASK]["acc,none"]
    assert acc == pytest.approx(correct / len(samples))
