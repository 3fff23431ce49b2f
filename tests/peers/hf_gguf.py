"""The steps the make_*_gguf.py generators share: the donor tokenizer beside a saved
transformers model, llama.cpp's converter imported from its source tree, and the conversion."""
import argparse
import runpy
import shutil
import sys
from pathlib import Path


def parse_args(hf_name):
    """The generators' arguments (`--llama`, `--tokenizer`, `--out`, `--keep-hf`), with the
    output directory made."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama", required=True, type=Path, help="llama.cpp source directory")
    ap.add_argument("--tokenizer", required=True, type=Path, help="a directory with tokenizer.json")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--keep-hf", action="store_true",
                    help=f"also keep the HF directory (bf16 safetensors) as OUT_DIR/{hf_name}")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    return a


def add_tokenizer(hf, tokenizer, keep_hf, out_dir, name):
    """Copies the donor's tokenizer files into the saved model `hf`; with `keep_hf`, keeps a
    copy of the whole model as `out_dir / name`."""
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        if (tokenizer / f).exists():
            shutil.copy(tokenizer / f, hf / f)
    if keep_hf:
        shutil.copytree(hf, out_dir / name, dirs_exist_ok=True)


def import_converter(llama):
    """Puts llama.cpp's converter (source tree `llama`) on the path and returns its
    `conversion.base`, taught SmolLM2's pre-tokenizer (not among the converter's hashes)."""
    sys.path[:0] = [str(llama), str(llama / "gguf-py")]
    import conversion.base as base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
    return base


def convert(llama, hf, out, *extra):
    """Runs llama.cpp's converter on `hf` into the Q8_0 GGUF `out`, with `extra` arguments."""
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "q8_0", *extra,
                "--outfile", str(out)]
    runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")
    print("wrote", out, out.stat().st_size, "bytes")
