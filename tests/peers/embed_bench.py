#!/usr/bin/env python3
"""Embedding and reranking throughput, side by side: sentence-transformers on PyTorch (CPU,
in-process), llama.cpp's `llama-server --embedding`, and `lmi serve`, on the same random-weight
models of published shapes.

  # once: the models (torch, transformers, sentence-transformers in the venv that runs this)
  python tests/peers/embed_bench.py make --out ~/.cache/lmi-bench/embed
  # sentence-transformers in this process (torch threads = --threads)
  python tests/peers/embed_bench.py st --dir ~/.cache/lmi-bench/embed --threads 2
  # a running server on minilm/: lmi or llama-server (`/v1/embeddings`)
  python tests/peers/embed_bench.py http --dir ~/.cache/lmi-bench/embed --url http://127.0.0.1:8080
  # a running server on reranker/ (`/v1/rerank`)
  python tests/peers/embed_bench.py http --dir ~/.cache/lmi-bench/embed --url ... --rerank

`make` writes `minilm/` (all-MiniLM-L6-v2's shape: BERT, 6 layers, hidden 384, 12 heads,
intermediate 1536, a 30,522-token WordPiece vocabulary of made-up words, mean pooling and
Normalize, as sentence-transformers saves it), `reranker/` (bge-reranker-base's shape:
XLM-RoBERTa, 12 layers, hidden 768, 12 heads, intermediate 3072, one label; a 32,000-piece
vocabulary instead of 250,002, which only changes the size of the embedding table), and
`sentences.json`: 1,000 sentences of 32–128 tokens each (the count includes [CLS] and [SEP]),
a query and 100 documents of 64–160 tokens. Each command prints one `RESULT {json}` line:
sentences per second for the 1,000 (batched: `--batch` inputs a call), the median latency of
one sentence alone, and documents per second reranking the 100.
"""
import argparse
import json
import os
import random
import statistics
import time
import urllib.request

MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, vocab_size=30522, max_position_embeddings=512)
RERANKER = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, vocab_size=32000, max_position_embeddings=514)


def made_up_words(n, rng):
    """n distinct lowercase pseudo-words of 3-9 letters."""
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    out, seen = [], set()
    while len(out) < n:
        w = "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(2, 4)))
        w = w[: rng.randint(3, len(w))]
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def make(out):
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram, WordPiece
    from transformers import (BertConfig, BertModel, BertTokenizerFast, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification, XLMRobertaTokenizerFast)

    rng = random.Random(0)
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)

    # MiniLM-shaped BERT with a WordPiece vocabulary of made-up words.
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = made_up_words(MINILM["vocab_size"] - len(specials), rng)
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    bert_dir = os.path.join(out, "minilm-hf")
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]",
                             pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                             model_max_length=512)
    cfg = BertConfig(**MINILM, type_vocab_size=2, pad_token_id=0)
    BertModel(cfg).eval().save_pretrained(bert_dir)
    fast.save_pretrained(bert_dir)
    word = models.Transformer(bert_dir, max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pool, models.Normalize()]).save(os.path.join(out, "minilm"))

    # bge-reranker-base-shaped XLM-RoBERTa cross-encoder with a Unigram vocabulary.
    x_specials = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = [(t, 0.0) for t in x_specials]
    xw = made_up_words(RERANKER["vocab_size"] - len(x_specials) - 1, random.Random(1))
    pieces += [("\u2581" + w, -float(i % 97) / 10 - 1) for i, w in enumerate(xw)]
    pieces.append(("<mask>", 0.0))
    xtok = Tokenizer(Unigram(pieces, unk_id=3))
    xtok.normalizer = normalizers.NFKC()
    xtok.pre_tokenizer = pre_tokenizers.Metaspace()
    xtok.decoder = decoders.Metaspace()
    xtok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    rr_dir = os.path.join(out, "reranker")
    xfast = XLMRobertaTokenizerFast(tokenizer_object=xtok, bos_token="<s>", eos_token="</s>",
                                    sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                    pad_token="<pad>", mask_token="<mask>", model_max_length=512)
    xcfg = XLMRobertaConfig(**RERANKER, num_labels=1, pad_token_id=1, bos_token_id=0,
                            eos_token_id=2, type_vocab_size=1)
    XLMRobertaForSequenceClassification(xcfg).eval().save_pretrained(rr_dir)
    xfast.save_pretrained(rr_dir)

    def sentence(lo, hi, words, r):
        return " ".join(r.choice(words) for _ in range(r.randint(lo, hi) - 2))

    data = {
        "sentences": [sentence(32, 128, words, rng) for _ in range(1000)],
        "query": sentence(12, 24, xw, rng),
        "documents": [sentence(64, 160, xw, rng) for _ in range(100)],
    }
    with open(os.path.join(out, "sentences.json"), "w") as f:
        json.dump(data, f)
    print("wrote", out)


def load_data(d):
    with open(os.path.join(d, "sentences.json")) as f:
        return json.load(f)


def st(d, threads, batch):
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    torch.set_num_threads(threads)
    data = load_data(d)
    m = SentenceTransformer(os.path.join(d, "minilm"), device="cpu")
    m.encode(data["sentences"][:64], batch_size=batch)  # warm-up
    t = time.perf_counter()
    m.encode(data["sentences"], batch_size=batch)
    tput = len(data["sentences"]) / (time.perf_counter() - t)
    lat = []
    for s in data["sentences"][:50]:
        t = time.perf_counter()
        m.encode([s], batch_size=1)
        lat.append(time.perf_counter() - t)
    ce = CrossEncoder(os.path.join(d, "reranker"), device="cpu", max_length=512)
    pairs = [(data["query"], doc) for doc in data["documents"]]
    ce.predict(pairs[:8], batch_size=batch)
    t = time.perf_counter()
    ce.predict(pairs, batch_size=batch)
    rr = len(pairs) / (time.perf_counter() - t)
    print("RESULT " + json.dumps({"peer": "sentence-transformers", "threads": threads,
                                  "batch": batch, "sentences_per_s": tput,
                                  "latency_ms_median": statistics.median(lat) * 1e3,
                                  "rerank_docs_per_s": rr}))


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def http(d, url, batch, concurrency, rerank):
    data = load_data(d)
    out = {"url": url}
    if rerank:
        body = {"query": data["query"], "documents": data["documents"], "model": "m"}
        post(url, "/v1/rerank", dict(body, documents=data["documents"][:8]))
        t = time.perf_counter()
        r = post(url, "/v1/rerank", body)
        out["rerank_docs_per_s"] = len(data["documents"]) / (time.perf_counter() - t)
        assert len(r["results"]) == len(data["documents"]), r
    else:
        out.update(http_embed(data["sentences"], url, batch, concurrency))
    print("RESULT " + json.dumps(out))


def http_embed(sents, url, batch, concurrency):
    from concurrent.futures import ThreadPoolExecutor

    def embed(chunk):
        out = post(url, "/v1/embeddings", {"input": chunk, "model": "m"})
        assert len(out["data"]) == len(chunk), out
        return out

    embed(sents[:batch])  # warm-up
    chunks = [sents[i:i + batch] for i in range(0, len(sents), batch)]
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(embed, chunks))
    tput = len(sents) / (time.perf_counter() - t)
    lat = []
    for s in sents[:50]:
        t = time.perf_counter()
        embed([s])
        lat.append(time.perf_counter() - t)
    return {"batch": batch, "concurrency": concurrency, "sentences_per_s": tput,
            "latency_ms_median": statistics.median(lat) * 1e3}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    s = sub.add_parser("st")
    s.add_argument("--dir", required=True)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--batch", type=int, default=32)
    h = sub.add_parser("http")
    h.add_argument("--dir", required=True)
    h.add_argument("--url", required=True)
    h.add_argument("--batch", type=int, default=32)
    h.add_argument("--concurrency", type=int, default=2)
    h.add_argument("--rerank", action="store_true",
                   help="rerank the 100 documents through /v1/rerank (a server on reranker/)")
    a = ap.parse_args()
    if a.cmd == "make":
        make(os.path.expanduser(a.out))
    elif a.cmd == "st":
        st(os.path.expanduser(a.dir), a.threads, a.batch)
    else:
        http(os.path.expanduser(a.dir), a.url.rstrip("/"), a.batch, a.concurrency, a.rerank)


if __name__ == "__main__":
    main()
