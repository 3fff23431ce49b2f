#!/usr/bin/env python3
"""llama.cpp's own converter (convert_hf_to_gguf.py) on the random-weight embedding models of
embed_bench.py, whose made-up vocabularies it cannot identify by its tokenizer hashes: the
pre-tokenizer is declared as BERT's ("default"), which is what a WordPiece BERT is.

  PYTHONPATH=$LLAMA_CPP/gguf-py:$LLAMA_CPP python tests/peers/convert_embed_gguf.py \
      $LLAMA_CPP ~/.cache/lmi-bench/embed/minilm --outtype f32 --outfile minilm-f32.gguf
"""
import runpy
import sys

llama_cpp = sys.argv.pop(1)
sys.path.insert(0, llama_cpp)
import conversion.base as base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
sys.argv[0] = f"{llama_cpp}/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
