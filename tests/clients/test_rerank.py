"""Scoring routes driven by real clients against `lmi serve` on the cross-encoder, classifier
and Qwen3-Reranker fixtures (tests/fixtures/embed/, with the scores CrossEncoder.predict and
transformers computed): the cohere SDK's Client.rerank (v1) and ClientV2.rerank (v2), TEI's
/rerank and /predict, vLLM's /score, LMI's /invocations. Scores must match within 1e-4."""

import math

import cohere
import pytest
import requests
from conftest import embed_reference as reference
from conftest import serve_embed_fixture as serve

TOL = 1e-4


def by_query(pairs):
    """{query: [pair, ...]} in the reference's order."""
    out = {}
    for p in pairs:
        out.setdefault(p["query"], []).append(p)
    return out


@pytest.fixture(scope="module")
def bert_cross():
    with serve("bert_cross") as base:
        yield base


@pytest.fixture(scope="module")
def xlmr_rerank():
    with serve("xlmr_rerank") as base:
        yield base


@pytest.fixture(scope="module")
def bert_classify():
    with serve("bert_classify") as base:
        yield base


@pytest.fixture(scope="module")
def qwen3_reranker():
    with serve("qwen3_reranker", "-o", "option.task=rerank") as base:
        yield base


def check_ranking(results, group, score_of):
    """Results sorted by score, each matching its document's reference score."""
    scores = [score_of(r) for r in results]
    assert scores == sorted(scores, reverse=True), scores
    for r in results:
        assert abs(score_of(r) - group[r.index]["score"]) < TOL


@pytest.mark.parametrize("model", ["bert_cross", "xlmr_rerank"])
def test_cohere_sdk_v1_and_v2(model, request):
    base = request.getfixturevalue(model)
    v1 = cohere.Client(base_url=base, api_key="unused")
    v2 = cohere.ClientV2(base_url=base, api_key="unused")
    for query, group in by_query(reference(model)["pairs"]).items():
        docs = [p["document"] for p in group]
        out = v1.rerank(query=query, documents=docs, return_documents=True)
        assert len(out.results) == len(docs)
        check_ranking(out.results, group, lambda r: r.relevance_score)
        for r in out.results:
            assert r.document.text == docs[r.index]
        out = v1.rerank(query=query, documents=docs, top_n=1, return_documents=False)
        assert len(out.results) == 1 and out.results[0].document is None
        best = max(range(len(group)), key=lambda i: group[i]["score"])
        assert out.results[0].index == best
        out = v2.rerank(model="m", query=query, documents=docs)
        check_ranking(out.results, group, lambda r: r.relevance_score)
        assert out.id and out.id.startswith("rerank-")


def test_tei_rerank_raw_and_text(bert_cross):
    for query, group in by_query(reference("bert_cross")["pairs"]).items():
        texts = [p["document"] for p in group]
        r = requests.post(f"{bert_cross}/rerank", json={"query": query, "texts": texts, "return_text": True})
        assert r.status_code == 200, r.text
        ranks = r.json()
        assert [x["score"] for x in ranks] == sorted((x["score"] for x in ranks), reverse=True)
        for x in ranks:
            assert abs(x["score"] - group[x["index"]]["score"]) < TOL
            assert x["text"] == texts[x["index"]]
        r = requests.post(f"{bert_cross}/rerank", json={"query": query, "texts": texts, "raw_scores": True})
        for x in r.json():
            assert abs(x["score"] - group[x["index"]]["logits"][0]) < TOL
            assert "text" not in x
    r = requests.post(f"{bert_cross}/rerank", json={"query": "q", "texts": []})
    assert (r.status_code, r.json()["error_type"]) == (400, "empty"), r.text
    # /rerank with `documents` answers in Cohere's / vLLM's shape.
    r = requests.post(f"{bert_cross}/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    r = requests.post(f"{bert_cross}/v1/rerank", json={"query": "q", "documents": []})
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"], r.text


def test_vllm_score(bert_cross):
    pairs = reference("bert_cross")["pairs"]
    query, group = next(iter(by_query(pairs).items()))
    r = requests.post(f"{bert_cross}/score", json={"model": "m", "text_1": query, "text_2": [p["document"] for p in group]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("score-")
    for d, p in zip(body["data"], group):
        assert d["object"] == "score" and abs(d["score"] - p["score"]) < TOL
    # N:N, in order.
    r = requests.post(f"{bert_cross}/v1/score", json={"text_1": [p["query"] for p in pairs], "text_2": [p["document"] for p in pairs]})
    assert [d["index"] for d in r.json()["data"]] == list(range(len(pairs)))
    for d, p in zip(r.json()["data"], pairs):
        assert abs(d["score"] - p["score"]) < TOL
    r = requests.post(f"{bert_cross}/score", json={"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert r.status_code == 400 and "text_1" in r.json()["error"]["message"], r.text


def test_lmi_invocations_scores(bert_cross):
    query, group = next(iter(by_query(reference("bert_cross")["pairs"]).items()))
    texts = [p["document"] for p in group]
    r = requests.post(f"{bert_cross}/invocations", json={"query": query, "texts": texts})
    assert r.status_code == 200, r.text
    got = r.json()
    assert len(got) == len(texts)
    for row, p in zip(got, group):
        assert len(row) == 1 and abs(row[0] - p["score"]) < TOL
    r = requests.post(f"{bert_cross}/invocations", json={"text": query, "text_pair": texts[0]})
    assert abs(r.json()[0] - group[0]["score"]) < TOL
    r = requests.post(f"{bert_cross}/invocations", json=[{"key": query, "value": t} for t in texts])
    assert len(r.json()) == len(texts)
    r = requests.post(f"{bert_cross}/invocations", json={"prompt": "hello"})
    assert r.status_code == 400 and "/rerank" in r.json()["error"], r.text


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_tei_predict_classifier(bert_classify):
    ref = reference("bert_classify")
    labels = ref["id2label"]
    for i in ref["inputs"]:
        r = requests.post(f"{bert_classify}/predict", json={"inputs": i["text"]})
        assert r.status_code == 200, r.text
        preds = r.json()
        want = softmax(i["logits"])
        assert [p["score"] for p in preds] == sorted((p["score"] for p in preds), reverse=True)
        for p in preds:
            k = next(k for k, v in labels.items() if v == p["label"])
            assert abs(p["score"] - want[int(k)]) < TOL
    texts = [[i["text"]] for i in ref["inputs"][:2]]
    r = requests.post(f"{bert_classify}/predict", json={"inputs": texts, "raw_scores": True})
    assert len(r.json()) == 2
    for preds, i in zip(r.json(), ref["inputs"]):
        for p in preds:
            k = next(k for k, v in labels.items() if v == p["label"])
            assert abs(p["score"] - i["logits"][int(k)]) < TOL
    # A classifier is not a reranker.
    r = requests.post(f"{bert_classify}/rerank", json={"query": "q", "texts": ["a"]})
    assert 400 <= r.status_code < 500 and "/predict" in r.json()["error"], r.text
    r = requests.post(f"{bert_classify}/embed", json={"inputs": "a"})
    assert r.status_code == 400 and "/predict" in r.json()["error"], r.text


def test_qwen3_reranker(qwen3_reranker):
    ref = reference("qwen3_reranker")
    for query, group in by_query(ref["pairs"]).items():
        docs = [p["document"] for p in group]
        r = requests.post(f"{qwen3_reranker}/v1/rerank", json={"query": query, "documents": docs})
        assert r.status_code == 200, r.text
        for x in r.json()["results"]:
            assert abs(x["relevance_score"] - group[x["index"]]["score"]) < TOL
        r = requests.post(f"{qwen3_reranker}/rerank", json={"query": query, "texts": docs, "raw_scores": True})
        for x in r.json():
            p = group[x["index"]]
            assert abs(x["score"] - (p["yes_logit"] - p["no_logit"])) < TOL
