"""Prompt logprobs on /v1/completions (`echo` with `logprobs`, as OpenAI's legacy API and vLLM
answer them): the prompt's tokens, their logprobs (the first null) and top-N alternatives come
before the completion's, with the same figures as LMI's `decoder_input_details`; `max_tokens: 0`
scores the prompt without generating; streams send them in each choice's first chunk."""

import json

import pytest
import requests

PROMPT = "The capital of France is Paris"


def post(url, path, body):
    r = requests.post(f"{url}{path}", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def lmi_prefill(url, text):
    """The server's own prompt logprobs: LMI's decoder_input_details."""
    out = post(url, "/invocations", {
        "inputs": text,
        "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True},
    })
    return out["details"]["prefill"]


def sse_events(resp):
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


def test_echo_logprobs_list_the_prompt_with_decoder_input_details_figures(url):
    prefill = lmi_prefill(url, PROMPT)
    out = post(url, "/v1/completions", {
        "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 2, "temperature": 0,
    })
    (choice,) = out["choices"]
    lp = choice["logprobs"]
    n = len(prefill)
    assert lp["tokens"][:n] == [t["text"] for t in prefill]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # The same float32 figures, printed the same way.
    assert lp["token_logprobs"][1:n] == [t["log_prob"] for t in prefill[1:]]
    for i in range(1, n):
        top = lp["top_logprobs"][i]
        assert 1 <= len(top) <= 2
        # The alternatives are the best: none below the token's own logprob unless it is in them.
        assert max(top.values()) >= lp["token_logprobs"][i]
    # Then the two generated tokens, their offsets after the prompt text.
    assert len(lp["tokens"]) == n + 2
    assert choice["text"].startswith(PROMPT)
    assert lp["text_offset"][0] == 0 and lp["text_offset"][n] == len(PROMPT)
    assert out["usage"]["completion_tokens"] == 2


def test_max_tokens_zero_scores_the_prompt_without_generating(url):
    prefill = lmi_prefill(url, PROMPT)
    out = post(url, "/v1/completions", {
        "prompt": [PROMPT, "Hello"], "echo": True, "logprobs": 1, "max_tokens": 0, "n": 2,
    })
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for c in choices[:2]:
        assert c["text"] == PROMPT
        assert c["finish_reason"] == "length"
        assert c["logprobs"]["token_logprobs"][1:] == [t["log_prob"] for t in prefill[1:]]
        assert len(c["logprobs"]["tokens"]) == len(prefill)
    assert all(c["text"] == "Hello" for c in choices[2:])
    assert out["usage"]["completion_tokens"] == 0
    assert out["usage"]["prompt_tokens"] == len(prefill) + len(choices[2]["logprobs"]["tokens"])


def test_token_id_prompts_score_as_their_text(url):
    prefill = lmi_prefill(url, PROMPT)
    ids = [t["id"] for t in prefill]
    out = post(url, "/v1/completions", {
        "prompt": [ids, ids[:3]], "echo": True, "logprobs": 1, "max_tokens": 0,
    })
    a, b = sorted(out["choices"], key=lambda c: c["index"])
    assert a["text"] == PROMPT
    assert a["logprobs"]["token_logprobs"][1:] == [t["log_prob"] for t in prefill[1:]]
    # A prefix scores the same as inside the longer prompt (causal attention).
    assert b["logprobs"]["token_logprobs"][1:] == [t["log_prob"] for t in prefill[1:3]]


def test_stream_sends_the_prompt_logprobs_in_each_choices_first_chunk(url):
    prefill = lmi_prefill(url, PROMPT)
    body = {
        "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0,
        "n": 2, "stream": True, "stream_options": {"include_usage": True},
    }
    with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        events = sse_events(r)
    for index in (0, 1):
        chunks = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == index]
        first = chunks[0]
        assert first["text"] == PROMPT
        assert first["logprobs"]["token_logprobs"][0] is None
        assert first["logprobs"]["token_logprobs"][1:] == [t["log_prob"] for t in prefill[1:]]
        rest = chunks[1:]
        assert len(rest) == 2 and rest[-1]["finish_reason"] == "length"
        assert all(len(c["logprobs"]["tokens"]) == 1 for c in rest)
        assert rest[0]["logprobs"]["text_offset"] == [len(PROMPT)]
    assert events[-1]["usage"]["completion_tokens"] == 4

    body["max_tokens"] = 0
    body["n"] = 1
    with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=300) as r:
        events = sse_events(r)
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert texts == [PROMPT, ""]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("body, message", [
    ({"prompt": "Hi", "max_tokens": 0}, "0 is only for scoring the prompt"),
    ({"prompt": [1, 999999999], "echo": True, "logprobs": 1, "max_tokens": 0},
     "not in the model's vocabulary"),
    ({"prompt": [[1], []], "echo": True}, "prompt[1] must not be an empty list"),
    ({"prompt": [1, -1]}, "must be a token id"),
    ({"prompt": "Hi", "echo": True, "logprobs": 9}, "logprobs must be an integer in [0, 5]"),
])
def test_bad_scoring_requests_get_openai_errors_and_the_server_keeps_serving(url, body, message):
    r = requests.post(f"{url}/v1/completions", json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()
    assert set(err) == {"error", "error_type"}, err
    assert message in err["error"]
    ok = post(url, "/v1/completions", {"prompt": "Hi", "echo": True, "logprobs": 1, "max_tokens": 0})
    assert ok["choices"][0]["text"] == "Hi"
