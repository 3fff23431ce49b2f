"""Embedding routes driven by real clients against `lmi serve` on the embedding fixtures
(tests/fixtures/embed/, written by sentence-transformers with its reference vectors): the
openai SDK's embeddings.create (float, and base64 as the SDK decodes it), huggingface_hub's
InferenceClient.feature_extraction and sentence_similarity, TEI's /embed (prompt_name,
truncation), LMI's /invocations; and the bad inputs each route must refuse with a message that
says what to fix. Vectors must match sentence-transformers' encode to cosine >= 0.99999."""

import base64
import math
import struct

import pytest
import requests
from conftest import EMBED_MAX_INPUTS as MAX_INPUTS
from conftest import embed_reference as reference
from conftest import serve_embed_fixture as serve
from huggingface_hub import InferenceClient
from openai import BadRequestError, OpenAI


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb)


def assert_close(got, want):
    assert len(got) == len(want), (len(got), len(want))
    c = cosine(got, want)
    assert c >= 0.99999, c


@pytest.fixture(scope="module")
def bert_mean():
    with serve("bert_mean") as base:
        yield base


@pytest.fixture(scope="module")
def bert_cls_dense():
    with serve("bert_cls_dense") as base:
        yield base


@pytest.fixture(scope="module")
def qwen3_embedding():
    with serve("qwen3_embedding") as base:
        yield base


def plain_inputs(ref):
    """The reference inputs encoded without a prompt."""
    return [i for i in ref["inputs"] if i["prompt_name"] is None]


def test_openai_sdk_float_and_base64(bert_mean):
    ref = plain_inputs(reference("bert_mean"))
    texts = [i["text"] for i in ref]
    client = OpenAI(base_url=f"{bert_mean}/v1", api_key="unused")
    # One input over max_seq_length: vLLM's truncate_prompt_tokens=-1 cuts it as
    # sentence-transformers did.
    cut = {"truncate_prompt_tokens": -1}
    out = client.embeddings.create(model="bert", input=texts, encoding_format="float", extra_body=cut)
    assert out.object == "list" and out.model == "bert"
    assert [d.index for d in out.data] == list(range(len(texts)))
    for d, r in zip(out.data, ref):
        assert d.object == "embedding"
        assert_close(d.embedding, r["embedding"])
    assert out.usage.prompt_tokens == sum(len(i["ids"]) for i in ref)
    assert out.usage.total_tokens == out.usage.prompt_tokens

    # No encoding_format: the SDK asks for base64 and decodes it itself.
    out = client.embeddings.create(model="bert", input=texts, extra_body=cut)
    for d, r in zip(out.data, ref):
        assert_close(d.embedding, r["embedding"])

    # Explicit base64: the string is the vector's little-endian f32 bytes.
    out = client.embeddings.create(model="bert", input=texts[0], encoding_format="base64")
    raw = base64.b64decode(out.data[0].embedding)
    assert_close(list(struct.unpack(f"<{len(raw) // 4}f", raw)), ref[0]["embedding"])

    # Token ids embed as the text they spell.
    out = client.embeddings.create(model="bert", input=[ref[0]["ids"]], encoding_format="float")
    assert_close(out.data[0].embedding, ref[0]["embedding"])


def test_openai_sdk_refuses_dimensions(bert_mean):
    client = OpenAI(base_url=f"{bert_mean}/v1", api_key="unused")
    width = len(reference("bert_mean")["inputs"][0]["embedding"])
    for dims in (8, width + 1):
        with pytest.raises(BadRequestError) as e:
            client.embeddings.create(model="bert", input="hello", dimensions=dims)
        assert "dimensions" in str(e.value), e.value


def test_over_long_input_names_the_limit(bert_mean):
    ref = reference("bert_mean")
    long = max(ref["inputs"], key=lambda i: len(i["text"]))
    limit = ref["max_seq_length"]
    r = requests.post(f"{bert_mean}/v1/embeddings", json={"input": long["text"]})
    assert r.status_code == 400, r.text
    assert str(limit) in r.json()["error"]["message"], r.text
    r = requests.post(f"{bert_mean}/embed", json={"inputs": long["text"]})
    assert 400 <= r.status_code < 500 and str(limit) in r.json()["error"], r.text
    r = requests.post(f"{bert_mean}/embed", json={"inputs": long["text"], "truncate": True})
    assert r.status_code == 200, r.text
    assert_close(r.json()[0], long["embedding"])


BAD_BODIES = [
    ({"input": ""}, "empty string"),
    ({"input": []}, "empty list"),
    ({"input": 5}, "must be a string"),
    ({"input": ["a", {"x": 1}]}, "input[1]"),
    ({"input": [[]]}, "empty list of token ids"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({}, "`input` is required"),
]


@pytest.mark.parametrize("body,says", BAD_BODIES)
def test_openai_bad_input(bert_mean, body, says):
    r = requests.post(f"{bert_mean}/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_non_utf8_and_too_many_inputs(bert_mean):
    bad = b'{"input": "caf\xe9"}'
    for path, shape in (("/v1/embeddings", "openai"), ("/embed", "tei")):
        body = bad if path == "/v1/embeddings" else bad.replace(b'"input"', b'"inputs"')
        r = requests.post(f"{bert_mean}{path}", data=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"] if shape == "openai" else r.json()["error"]
        assert "JSON" in msg, msg
    many = ["hello"] * 10_000
    r = requests.post(f"{bert_mean}/v1/embeddings", json={"input": many})
    assert r.status_code == 413, r.text
    assert str(MAX_INPUTS) in r.json()["error"]["message"], r.text
    r = requests.post(f"{bert_mean}/embed", json={"inputs": many})
    assert r.status_code == 413, r.text
    assert r.json()["error_type"] == "validation" and str(MAX_INPUTS) in r.json()["error"]


def test_tei_embed_shapes_and_errors(bert_mean):
    ref = plain_inputs(reference("bert_mean"))
    r = requests.post(f"{bert_mean}/embed", json={"inputs": ref[0]["text"]})
    assert r.status_code == 200, r.text
    assert len(r.json()) == 1
    assert_close(r.json()[0], ref[0]["embedding"])
    r = requests.post(f"{bert_mean}/embed", json={"inputs": [ref[1]["text"], ref[2]["text"]]})
    got = r.json()
    assert len(got) == 2
    assert_close(got[0], ref[1]["embedding"])
    assert_close(got[1], ref[2]["embedding"])
    r = requests.post(f"{bert_mean}/embed", json={"inputs": []})
    assert (r.status_code, r.json()["error_type"]) == (400, "empty"), r.text
    r = requests.post(f"{bert_mean}/embed", json={"inputs": "a", "truncation_direction": "up"})
    assert (r.status_code, r.json()["error_type"]) == (422, "validation"), r.text
    r = requests.post(f"{bert_mean}/embed_sparse", json={"inputs": "a"})
    assert r.status_code == 400 and "/embed" in r.json()["error"], r.text


def test_tei_prompt_name(bert_cls_dense, qwen3_embedding):
    for base, model in ((bert_cls_dense, "bert_cls_dense"), (qwen3_embedding, "qwen3_embedding")):
        ref = reference(model)
        for i in ref["inputs"]:
            body = {"inputs": i["text"], "truncate": True}
            if i["prompt_name"] is not None:
                body["prompt_name"] = i["prompt_name"]
            r = requests.post(f"{base}/embed", json=body)
            assert r.status_code == 200, (model, r.text)
            assert_close(r.json()[0], i["embedding"])
        r = requests.post(f"{base}/embed", json={"inputs": "a", "prompt_name": "nope"})
        assert 400 <= r.status_code < 500 and "nope" in r.json()["error"], r.text


def test_huggingface_hub_feature_extraction_and_similarity(bert_mean):
    ref = plain_inputs(reference("bert_mean"))
    # A URL as the model: InferenceClient posts to it, and TEI answers POST / with /embed.
    client = InferenceClient(model=bert_mean)
    v = client.feature_extraction(ref[0]["text"])
    assert v.shape == (1, len(ref[0]["embedding"]))
    assert_close(v[0].tolist(), ref[0]["embedding"])
    sims = InferenceClient(model=f"{bert_mean}/similarity").sentence_similarity(
        ref[0]["text"], other_sentences=[ref[1]["text"], ref[2]["text"]]
    )
    for got, other in zip(sims, ref[1:3]):
        assert abs(got - cosine(ref[0]["embedding"], other["embedding"])) < 1e-4, sims


def test_lmi_invocations_returns_vectors(bert_mean):
    ref = plain_inputs(reference("bert_mean"))
    r = requests.post(f"{bert_mean}/invocations", json={"inputs": ref[0]["text"]})
    assert r.status_code == 200, r.text
    assert len(r.json()) == 1
    assert_close(r.json()[0], ref[0]["embedding"])
    r = requests.post(f"{bert_mean}/invocations", json={"inputs": [ref[1]["text"], ref[2]["text"]]})
    assert [len(v) for v in r.json()] == [len(ref[1]["embedding"])] * 2
    assert_close(r.json()[1], ref[2]["embedding"])
    r = requests.post(f"{bert_mean}/invocations", json={"inputs": 3})
    assert r.status_code == 424 and "'inputs' must be a string or list of strings" in r.json()["error"]
    # A generation body is a 400 that names what this model serves.
    r = requests.post(f"{bert_mean}/invocations", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "/v1/embeddings" in r.json()["error"], r.text


def test_generation_routes_on_an_embedding_model(bert_mean):
    r = requests.post(f"{bert_mean}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert "/v1/embeddings" in r.text, r.text


def test_embedding_routes_on_the_chat_model(url):
    """The default (generative) model answers each embedding and scoring route with a 400 in
    the route's error shape that names the routes it serves."""
    cases = [
        ("/v1/embeddings", {"input": "hi"}, lambda b: b["error"]["message"]),
        ("/embed", {"inputs": "hi"}, lambda b: b["error"]),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, lambda b: b["error"]),
        ("/rerank", {"query": "q", "texts": ["a"]}, lambda b: b["error"]),
        ("/v1/rerank", {"query": "q", "documents": ["a"]}, lambda b: b["error"]["message"]),
        ("/v2/rerank", {"query": "q", "documents": ["a"]}, lambda b: b["error"]["message"]),
        ("/score", {"text_1": "q", "text_2": ["a"]}, lambda b: b["error"]["message"]),
        ("/predict", {"inputs": "hi"}, lambda b: b["error"]),
    ]
    for path, body, message in cases:
        r = requests.post(f"{url}{path}", json=body)
        assert r.status_code == 400, (path, r.text)
        msg = message(r.json())
        assert "text-generation model" in msg and "/v1/chat/completions" in msg, (path, msg)
