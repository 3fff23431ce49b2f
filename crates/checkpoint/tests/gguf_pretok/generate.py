#!/usr/bin/env python3
"""Writes the fixtures of `crates/checkpoint/tests/gguf_pretok.rs`: for each pre-tokenizer row, a
small byte-level BPE trained with the `tokenizers` package (on whole lines, so that its merges
cross the row's boundaries) and given that row's pre-tokenizer as the original model's
tokenizer.json declares it, saved beside a tiny random Llama, converted by
llama.cpp's own `convert_hf_to_gguf.py` with `tokenizer.ggml.pre` set to the row's name (its hash
lookup cannot know a freshly trained tokenizer), and the HF ids of a corpus of hard strings.
Where llama.cpp's `llama-server` is built, its `/tokenize` ids on the same file are recorded too.

The committed GGUFs keep only the metadata (no tensors), so CI needs neither torch nor llama.cpp.

Run (not in CI): needs torch, transformers, tokenizers, numpy, sentencepiece and the llama.cpp
sources of the llama-cpp-python 0.3.36 source package:
    python3 generate.py --llama-cpp /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp \
        [--llama-server ~/.cache/lmi-peers/llama.cpp/bin/llama-server]
"""

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

HERE = Path(__file__).resolve().parent

SPECIALS = ["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<tool>"

# The converter's own check text (conversion/base.py, get_vocab_base_pre).
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

CORPUS = [
    CHKTXT,
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x[i] = y[i] * 2; }  // C++\n\tif (a != b && c >= d) {}",
    "我想在北京工作。東京は日本の首都です。서울은 한국의 수도입니다。",
    "👩\u200d👩\u200d👧\u200d👦 family, 🏳️\u200d🌈 flag, 👍🏽 thumbs, 🇫🇷 France",
    "1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159 1,000,000 ١٢٣٤ ४५६",
    "   leading spaces and trailing   \n\n\n   \t\t\t    \r\n \r\n\r\n" + " " * 40 + "x",
    "Mixed: Ελληνικά, русский, العربية, עברית, हिन्दी, ไทย, Tiếng Việt, Ññ ß İı",
    "Cafe\u0301 vs Café; ﬁ ligature; ＡＢＣ fullwidth; Ⅻ roman; x² superscript",
    "<|im_start|>user\nHello <tool> there!<|im_end|>\n<|im_start|>assistant\n<|bos|>x<|eos|>",
    "I'M SHOUTING, isn'T IT? They'LL see; you'D know. HTTPServerError camelCase snake_case",
    "https://example.com/path?q=1&r=two#frag email@example.org /usr/bin/env -- --flag=3",
    "<sentinel:12> IMGIMGABZ tab\tnew\nline    four  two",
]

# Short strings across the boundaries the rows' splits draw (scripts, digits, punctuation,
# spaces, newlines, case, contractions). Repeated in training, each is learnt as one or two
# tokens, so a split the importer draws differently from HF changes their ids.
PROBES = [
    "在apple工作", " 日本語です", "東京はtokyo", "한국어abc", "abc123def", "x=1;y+=22",
    "Hello,World!", "a\n\n  b", "end  \n\t", "I'M'll", "١٢٣x٤", "Cafe\u0301s", "\t\tfoo",
    "ab   cd", "<<=>>|~", "3...33", "path/to/file", "ÀÖØöÿ", "ΑΒΓαβγ", "3333333",
]
CORPUS.append(" ".join(PROBES))

TRAIN = CORPUS * 2 + PROBES * 40

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT4O = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TEKKEN = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DEEPSEEK3 = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPARK = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"""
CJK_KANA = r"[一-龥぀-ゟ゠-ヿ]+"
CJK_HANGUL = r"[一-龥ࠀ-一가-퟿]+"
BLOOM = r" ?[^(\s|[.,!?…。，、।۔،])]+"
DEEPSEEK_LLM_LETTERS = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
KIMI = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def split(regex):
    return pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)


def byte_level(use_regex):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def regexes(*rs):
    """Split steps then a byte mapping, as tiktoken-derived tokenizer.json files declare."""
    return [split(r) for r in rs] + [byte_level(False)]


# fixture name -> (tokenizer.ggml.pre to write, NFC?, pre-tokenizer steps, ignore_merges, add BOS)
ROWS = {
    "gpt-2": ("gpt-2", False, [byte_level(True)], False, False),
    "olmo": ("olmo", True, [byte_level(True)], False, False),
    "default": ("default", False, regexes(r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "starcoder": ("starcoder", False, [pre_tokenizers.Digits(individual_digits=True), byte_level(True)], False, False),
    "command-r": ("command-r", True, [pre_tokenizers.Digits(individual_digits=True), byte_level(True)], False, True),
    "falcon": ("falcon", False, [pre_tokenizers.Punctuation("contiguous"), byte_level(True), pre_tokenizers.Digits(individual_digits=False), split(r"[0-9][0-9][0-9]")], False, False),
    "llama-bpe": ("llama-bpe", False, regexes(LLAMA3), True, True),
    "glm4": ("glm4", False, regexes(LLAMA3), True, False),
    "dbrx": ("dbrx", False, regexes(LLAMA3), False, False),
    "qwen2": ("qwen2", True, regexes(QWEN2), False, False),
    "hunyuan": ("hunyuan", False, regexes(QWEN2), False, False),
    "qwen35": ("qwen35", True, regexes(QWEN35), False, False),
    "ufakzeka": ("ufakzeka", False, regexes(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), False, False),
    "seed-coder": ("seed-coder", False, regexes(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"), False, False),
    "bailingmoe": ("bailingmoe", False, regexes(r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"), False, False),
    "laguna": ("laguna", False, regexes(r"[^\n]+|[\n]+", QWEN2), False, False),
    "exaone-moe": ("exaone-moe", False, regexes(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"), False, False),
    "minicpm5": ("minicpm5", False, regexes(r"\p{N}{1,3}", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True, False),
    "jais-2": ("jais-2", False, regexes(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"), False, False),
    "deepseek-llm": ("deepseek-llm", False, [split(r"[\r\n]"), split(DEEPSEEK_LLM_LETTERS), split(r"\s?[!-/:-~！-／：-～‘-‟　-。]+"), split(r"\s+$"), split(CJK_HANGUL), pre_tokenizers.Digits(individual_digits=False), byte_level(False)], False, False),
    "deepseek-coder": ("deepseek-coder", False, [split(r"[\r\n]"), split(r"\s?\p{L}+"), split(r"\s?\p{P}+"), split(CJK_HANGUL), pre_tokenizers.Digits(individual_digits=True), byte_level(False)], False, False),
    "deepseek-v3": ("deepseek-v3", False, regexes(r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3), False, False),
    "spark2_5": ("spark2_5", False, regexes(r"\p{N}{1,3}", CJK_KANA, SPARK, r"\p{N}"), False, False),
    "youtu": ("youtu", False, regexes(r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+", r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True, False),
    "tekken": ("tekken", False, regexes(TEKKEN), True, True),
    "gpt-4o": ("gpt-4o", False, regexes(GPT4O), False, False),
    "granite-embed-multi-97m": ("granite-embed-multi-97m", False, regexes(GPT4O), True, False),
    "tiny_aya": ("tiny_aya", False, regexes(r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O), False, False),
    "kimi-k2": ("kimi-k2", False, regexes(KIMI), False, False),
    "bloom": ("bloom", False, regexes(BLOOM), False, False),
    "viking": ("viking", False, [split(BLOOM), pre_tokenizers.Digits(individual_digits=True), byte_level(False)], False, False),
    "chameleon": ("chameleon", False, regexes(r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2), False, True),
}


def train(pre, nfc, steps, ignore_merges, add_bos):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    # Trained on whole lines, so that merges cross every boundary the row's splits draw: a
    # split missing on the importer's side then changes the ids (with merges learnt under the
    # row's own splits it could not). The row's pre-tokenizer is set once trained.
    tok.pre_tokenizer = pre_tokenizers.Sequence([split(r"[^\n]+"), byte_level(False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=640,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN, trainer)
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.add_tokens([AddedToken(USER_DEFINED, special=False, normalized=False)])
    bos = tok.token_to_id("<|bos|>")
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_hf_dir(d: Path, tok: Tokenizer, add_bos: bool):
    import numpy as np
    from safetensors.numpy import save_file

    tok.save(str(d / "tokenizer.json"))
    n_vocab = tok.get_vocab_size()
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
    }))
    hidden, ffn, layers = 32, 64, 1
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": 2,
        "num_key_value_heads": 2, "vocab_size": n_vocab, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|eos|>"),
        "torch_dtype": "float32",
    }))
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)
    t = {"model.embed_tokens.weight": w(n_vocab, hidden), "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n, s in [("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden, hidden)),
                     ("self_attn.v_proj", (hidden, hidden)), ("self_attn.o_proj", (hidden, hidden)),
                     ("mlp.gate_proj", (ffn, hidden)), ("mlp.up_proj", (ffn, hidden)),
                     ("mlp.down_proj", (hidden, ffn))]:
            t[p + n + ".weight"] = w(*s)
        t[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})


def convert(llama_cpp: Path, hf: Path, out: Path, pre: str):
    """Runs the converter in this process (torch is imported once for all rows)."""
    import runpy

    for path in (str(llama_cpp / "gguf-py"), str(llama_cpp)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import conversion.base as base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outfile", str(out), "--outtype", "f32"]
    try:
        runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def strip_tensors(llama_cpp: Path, src: Path, dst: Path):
    """The same metadata in a GGUF with no tensors."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch=None)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.alignment":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_ids(server: Path, gguf_path: Path, texts):
    port = free_port()
    p = subprocess.Popen([str(server), "-m", str(gguf_path), "--port", str(port), "-c", "256", "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                if p.poll() is not None:
                    return None
                time.sleep(0.2)
        out = []
        for t in texts:
            req = urllib.request.Request(url + "/tokenize", data=json.dumps(
                {"content": t, "add_special": True, "parse_special": True}).encode(),
                headers={"Content-Type": "application/json"})
            out.append(json.load(urllib.request.urlopen(req, timeout=30))["tokens"])
        return out
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--llama-server", type=Path)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    exp_path = HERE / "expected.json"
    expected = json.loads(exp_path.read_text()) if exp_path.exists() else {}
    expected["corpus"] = CORPUS
    rows = expected.setdefault("rows", {})
    for name, (pre, nfc, steps, ignore_merges, add_bos) in ROWS.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            hf = tmp / "hf"
            hf.mkdir()
            tok = train(pre, nfc, steps, ignore_merges, add_bos)
            write_hf_dir(hf, tok, add_bos)
            full = tmp / "full.gguf"
            try:
                convert(args.llama_cpp, hf, full, pre)
            except (Exception, SystemExit) as e:
                print(f"{name}: converter failed: {e!r}", file=sys.stderr)
                continue
            strip_tensors(args.llama_cpp, full, HERE / f"{name}.gguf")
            hf_tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
            enc = [hf_tok.encode(t, add_special_tokens=True).ids for t in CORPUS]
            row = {
                "pre": pre,
                "hf": enc,
                "hf_decoded": [hf_tok.decode(ids, skip_special_tokens=False) for ids in enc],
                "llama_cpp": None,
            }
            if args.llama_server and args.llama_server.exists():
                row["llama_cpp"] = llama_server_ids(args.llama_server, full, CORPUS)
                if row["llama_cpp"] is not None:
                    row["llama_cpp_differs"] = [i for i, (a, b) in enumerate(zip(enc, row["llama_cpp"])) if a != b]
            rows[name] = row
            print(name, "ok", "llama.cpp differs on" if row.get("llama_cpp_differs") else "", row.get("llama_cpp_differs") or "")
    exp_path.write_text(json.dumps(expected, ensure_ascii=False, indent=None) + "\n")


if __name__ == "__main__":
    main()
