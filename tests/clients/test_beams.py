"""Beam search over HTTP: LMI `num_beams` / `num_return_sequences`, TensorRT-LLM's
`beam_width`, vLLM's `use_beam_search` on /v1/completions; streaming with beams is refused."""

import requests

PROMPT = "The capital of France is"


def test_lmi_beams_return_their_hypotheses(url):
    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": 10, "num_beams": 4, "num_return_sequences": 3, "details": True},
    }
    r = requests.post(f"{url}/invocations", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    others = out["details"]["best_of_sequences"]
    assert len(others) == 2
    texts = [out["generated_text"]] + [s["generated_text"] for s in others]
    assert len(set(texts)) == 3, texts
    # Deterministic: the same request gives the same beams; beam_width is the same knob.
    again = requests.post(f"{url}/invocations", json=body, timeout=120).json()
    assert again == out
    body["parameters"]["beam_width"] = body["parameters"].pop("num_beams")
    assert requests.post(f"{url}/invocations", json=body, timeout=120).json() == out


def test_vllm_use_beam_search_on_completions(url):
    body = {"prompt": PROMPT, "max_tokens": 10, "use_beam_search": True, "best_of": 3, "n": 2}
    r = requests.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["text"] != choices[1]["text"]


def test_streaming_beams_is_refused(url):
    body = {"inputs": PROMPT, "stream": True, "parameters": {"num_beams": 2}}
    r = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert 400 <= r.status_code < 500 and "stream" in r.text, r.text
    body = {"prompt": PROMPT, "stream": True, "use_beam_search": True, "best_of": 2}
    r = requests.post(f"{url}/v1/completions", json=body, timeout=60)
    assert 400 <= r.status_code < 500 and "stream" in r.text, r.text
