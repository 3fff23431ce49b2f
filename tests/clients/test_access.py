"""API keys and the request time limit on a real server: the openai SDK and huggingface_hub
with a key, 401 without one in each schema's shape, open health routes, and a stream ended by
option.request_timeout with the schema's error while its KV blocks are freed."""

import json
import re
import time

import pytest
import requests
from huggingface_hub import InferenceClient
from openai import AuthenticationError, OpenAI

from conftest import extra_server

KEY = "access-test-key"


@pytest.fixture(scope="module")
def guarded():
    with extra_server("-o", f"option.api_key={KEY},other-key", "-o", "option.request_timeout=3",
                      "--max-model-len", "2048") as base:
        yield base


def _blocks(base):
    m = re.search(r"^lmi_kv_cache_blocks_used (\S+)$", requests.get(f"{base}/metrics", timeout=10).text, re.M)
    return float(m.group(1))


def test_keys_are_required_and_accepted(guarded):
    msgs = [{"role": "user", "content": "Hi"}]
    ok = OpenAI(base_url=f"{guarded}/v1", api_key=KEY).chat.completions.create(
        model="m", messages=msgs, max_tokens=4)
    assert ok.choices[0].message.content is not None
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{guarded}/v1", api_key="wrong").chat.completions.create(
            model="m", messages=msgs, max_tokens=4)
    hf = InferenceClient(base_url=guarded, token="other-key")
    assert isinstance(hf.text_generation("Hello", max_new_tokens=3), str)
    r = requests.post(f"{guarded}/invocations", json={"inputs": "Hi"}, timeout=30)
    assert (r.status_code, r.json()["code"]) == (401, 401)
    r = requests.post(f"{guarded}/generate", json={"inputs": "Hi"}, headers={"x-api-key": "nope"}, timeout=30)
    assert (r.status_code, r.json()["error_type"]) == (401, "authentication")
    for path in ["/ping", "/health", "/metrics"]:
        assert requests.get(f"{guarded}{path}", timeout=10).status_code == 200, path
    metrics = requests.get(f"{guarded}/metrics", timeout=10).text
    assert 'lmi_auth_refused_total{reason="invalid"}' in metrics
    assert KEY not in metrics


def test_request_timeout_ends_a_stream_and_frees_its_blocks(guarded):
    started = time.time()
    r = requests.post(
        f"{guarded}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"messages": [{"role": "user", "content": "Write a very long story."}],
              "max_tokens": 1900, "stream": True, "temperature": 0.8, "ignore_eos": True},
        stream=True, timeout=60)
    assert r.status_code == 200
    events = [line[len("data: "):] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert time.time() - started < 30
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["http_status_code"] == 408 and "option.request_timeout" in err["message"], err
    deadline = time.time() + 10
    while _blocks(guarded) != 0:
        assert time.time() < deadline, "KV blocks still in use after the time limit"
        time.sleep(0.1)
    assert re.search(r"^lmi_request_timeouts_total [1-9]", requests.get(f"{guarded}/metrics").text, re.M)


def test_request_limits_and_validation_holes(guarded):
    h = {"Authorization": f"Bearer {KEY}"}
    msgs = [{"role": "user", "content": "Hi"}]
    r = requests.post(f"{guarded}/v1/chat/completions", headers=h, timeout=30,
                      json={"messages": msgs, "n": 17, "max_tokens": 2})
    assert r.status_code == 422 and "option.max_sequences_per_request" in r.json()["error"], r.text
    r = requests.post(f"{guarded}/v1/completions", headers=h, timeout=30,
                      json={"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 2})
    assert r.status_code == 422 and r.json()["error_type"] == "batch size exceeded", r.text
    r = requests.post(f"{guarded}/invocations", headers=h, timeout=30,
                      json={"inputs": ["a"] * 5, "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 424 and "max_client_batch_size" in r.text, r.text
    # A message without content is refused in each schema's shape (it used to generate).
    r = requests.post(f"{guarded}/v1/chat/completions", headers=h, timeout=30,
                      json={"messages": [{"role": "user"}], "max_tokens": 2})
    assert r.status_code == 422 and "messages[0].content is required" in r.json()["error"], r.text
    r = requests.post(f"{guarded}/invocations", headers=h, timeout=30,
                      json={"messages": [{"role": "user"}], "max_tokens": 2})
    assert r.status_code == 424 and r.json()["code"] == 424, r.text
    # A request target over option.max_uri_bytes: a clean 414.
    r = requests.post(f"{guarded}/generate?x={'a' * 9000}", headers=h, json={"inputs": "x"}, timeout=30)
    assert r.status_code == 414, r.status_code
