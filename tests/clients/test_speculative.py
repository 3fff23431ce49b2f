"""Speculative decoding from the client's side: OpenAI predicted outputs and TensorRT-LLM's
draft_input_ids change nothing in the output (greedy), and usage reports the prediction."""

import pytest
import requests
from openai import OpenAI

PASSAGE = (
    "The harbour town woke slowly in the grey light of autumn. Fishermen checked their nets "
    "along the quay while the smell of fresh bread drifted from the bakery on the corner."
)
ASK = [{"role": "user", "content": f"Repeat this sentence exactly:\n\n{PASSAGE}"}]


@pytest.fixture(scope="module")
def oai(url):
    return OpenAI(base_url=f"{url}/v1", api_key="none")


def test_prediction_keeps_the_output_and_reports_usage(oai):
    plain = oai.chat.completions.create(model="m", messages=ASK, max_tokens=48, temperature=0)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None
    for prediction in (text, PASSAGE, "something else entirely"):
        r = oai.chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=48,
            temperature=0,
            prediction={"type": "content", "content": prediction},
        )
        assert r.choices[0].message.content == text
        d = r.usage.completion_tokens_details
        assert d is not None
        assert d.accepted_prediction_tokens >= 0 and d.rejected_prediction_tokens >= 0
        if prediction == text:
            # The whole output was predicted: most of it comes from the draft.
            assert d.accepted_prediction_tokens >= r.usage.completion_tokens // 2, d


def test_streamed_prediction_equals_plain(oai):
    plain = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0)
    text = plain.choices[0].message.content
    stream = oai.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        prediction={"type": "content", "content": text},
    )
    got, usage = "", None
    for chunk in stream:
        for c in chunk.choices:
            got += c.delta.content or ""
        usage = chunk.usage or usage
    assert got == text
    assert usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_sampled_with_seed_is_unchanged_by_a_prediction(oai):
    args = dict(model="m", messages=ASK, max_tokens=32, temperature=0.8, seed=11)
    plain = oai.chat.completions.create(**args).choices[0].message.content
    r = oai.chat.completions.create(prediction={"type": "content", "content": PASSAGE}, **args)
    assert r.choices[0].message.content == plain


def test_lmi_draft_input_ids(url):
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 16}}
    plain = requests.post(f"{url}/invocations", json=body, timeout=60).json()
    ids = requests.post(f"{url}/tokenize", json={"inputs": plain["generated_text"]}, timeout=60).json()
    body["parameters"]["draft_input_ids"] = [t["id"] for t in ids]
    r = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"] == plain["generated_text"]
    body["parameters"]["draft_input_ids"] = [10**9]
    r = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert 400 <= r.status_code < 500 and "vocabulary" in r.text, r.text
