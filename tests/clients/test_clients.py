"""Real clients against `lmi serve` on the default model (greedy, so outputs are comparable)."""

import json
import time

import requests
from huggingface_hub import InferenceClient
from openai import OpenAI
from text_generation import Client

PROMPT = "The capital of France is"


def kv_blocks_used(url):
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("lmi_kv_cache_blocks_used"):
            return float(line.split()[-1])
    raise AssertionError("lmi_kv_cache_blocks_used missing from /metrics")


def wait_pool_idle(url):
    deadline = time.time() + 20
    while time.time() < deadline:
        if kv_blocks_used(url) == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"KV blocks still in use: {kv_blocks_used(url)}")


def test_hf_inference_client_text_generation(url):
    c = InferenceClient(base_url=url)
    text = c.text_generation(PROMPT, max_new_tokens=8, return_full_text=False)
    assert isinstance(text, str) and text
    # Like TGI's `/`, a text-generation model returns the prompt too unless told otherwise.
    assert c.text_generation(PROMPT, max_new_tokens=8) == PROMPT + text
    d = c.text_generation(PROMPT, max_new_tokens=8, details=True, return_full_text=False)
    assert d.generated_text == text
    assert d.details.finish_reason == "length"
    assert d.details.generated_tokens == 8
    assert len(d.details.tokens) == 8
    assert "".join(t.text for t in d.details.tokens) == text
    streamed = list(c.text_generation(PROMPT, max_new_tokens=8, stream=True))
    assert "".join(streamed) == text
    last = list(c.text_generation(PROMPT, max_new_tokens=8, stream=True, details=True, return_full_text=False))[-1]
    assert last.details.finish_reason == "length"
    assert last.generated_text == text


def test_hf_inference_client_chat(url):
    c = InferenceClient(base_url=url)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat_completion(msgs, max_tokens=12, temperature=0)
    content = r.choices[0].message.content
    assert content
    assert r.usage.completion_tokens <= 12
    chunks = list(c.chat_completion(msgs, max_tokens=12, stream=True, temperature=0))
    # Seeded sampling is reproducible too.
    a = c.chat_completion(msgs, max_tokens=12, temperature=0.9, seed=7).choices[0].message.content
    b = c.chat_completion(msgs, max_tokens=12, temperature=0.9, seed=7).choices[0].message.content
    assert a == b
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == content


def test_text_generation_client(url):
    c = Client(url, timeout=60)
    r = c.generate(PROMPT, max_new_tokens=8)
    assert r.generated_text
    assert r.details.generated_tokens == 8
    assert all(isinstance(t.special, bool) for t in r.details.tokens)
    toks = [s.token.text for s in c.generate_stream(PROMPT, max_new_tokens=8)]
    assert "".join(toks) == r.generated_text
    r2 = c.generate(PROMPT, max_new_tokens=4, decoder_input_details=True)
    assert len(r2.details.prefill) > 0


def test_openai_sdk(url):
    c = OpenAI(base_url=f"{url}/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Name a color."}]
    r = c.chat.completions.create(model="anything", messages=msgs, max_tokens=10, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    stream = c.chat.completions.create(
        model="anything", messages=msgs, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            parts.append(choice.delta.content or "")
    assert "".join(parts) == text
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
    comp = c.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0)
    assert comp.choices[0].text
    streamed = "".join(
        ch.choices[0].text for ch in c.completions.create(
            model="x", prompt=PROMPT, max_tokens=8, temperature=0, stream=True) if ch.choices
    )
    assert streamed == comp.choices[0].text
    models = c.models.list()
    assert len(models.data) == 1


def test_lmi_invocations_formats(url):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True}}
    r = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["details"]["generated_tokens"] == 6
    assert j["details"]["finish_reason"] == "length"
    lines = requests.post(f"{url}/invocations", json={**body, "stream": True}, timeout=60).text.strip().split("\n")
    objs = [json.loads(l) for l in lines if l.strip()]
    assert len(objs) == 6
    assert objs[-1]["generated_text"] == j["generated_text"]
    many = requests.post(f"{url}/invocations", json={"inputs": [PROMPT, "Hello"], "parameters": {"max_new_tokens": 3}}, timeout=60)
    assert many.status_code == 200, many.text
    assert len(many.json()) == 2
    chat = requests.post(f"{url}/invocations", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}, timeout=60)
    assert chat.status_code == 200, chat.text
    assert chat.json()["object"] == "chat.completion"


def test_disconnect_mid_stream_frees_kv_blocks(url):
    with requests.post(f"{url}/generate_stream", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 200}}, stream=True, timeout=60) as r:
        it = r.iter_lines()
        got = 0
        for line in it:
            if line.startswith(b"data:"):
                got += 1
                if got == 2:
                    break
    wait_pool_idle(url)
    assert requests.post(f"{url}/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}, timeout=60).status_code == 200


def test_bad_inputs_get_4xx_and_the_server_keeps_serving(url):
    cases = [
        ("/generate", b"{not json", 400, 499),
        ("/generate", json.dumps({"inputs": 5}).encode(), 400, 499),
        ("/generate", json.dumps({"inputs": ""}).encode(), 422, 422),
        ("/generate", json.dumps({"inputs": "x", "parameters": {"max_new_tokens": -1}}).encode(), 400, 499),
        ("/generate", json.dumps({"inputs": "x", "parameters": {"temperature": -0.5}}).encode(), 422, 422),
        ("/generate", json.dumps({"inputs": "x", "parameters": {"top_p": 1.5}}).encode(), 422, 422),
        ("/generate", json.dumps({"inputs": "hello " * 2000, "parameters": {"max_new_tokens": 4}}).encode(), 422, 422),
        ("/invocations", json.dumps({"inputs": "x", "parameters": {"temperature": "hot"}}).encode(), 424, 424),
        ("/invocations", json.dumps({"inputs": ""}).encode(), 424, 424),
        ("/invocations", json.dumps({"inputs": "x", "adapters": "nope"}).encode(), 424, 424),
        ("/invocations", json.dumps({"foo": 1}).encode(), 424, 424),
        ("/generate", b"x" * 3_000_000, 413, 413),
    ]
    for path, data, lo, hi in cases:
        r = requests.post(f"{url}{path}", data=data, headers={"content-type": "application/json"}, timeout=60)
        assert lo <= r.status_code <= hi, (path, data[:80], r.status_code, r.text[:300])
        if r.status_code in (422, 424):
            body = r.json()
            assert "error" in body, body
    ok = requests.post(f"{url}/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}, timeout=60)
    assert ok.status_code == 200
    wait_pool_idle(url)
