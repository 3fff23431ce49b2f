#!/usr/bin/env python3
"""The peer of `lmi bench vision`'s preprocessing table: the same image files through Pillow and
transformers' Qwen2-VL image processor (the slow, PIL one, whose output lmi-media reproduces
bit for bit), on one thread.

  ./target/release/lmi bench vision --no-full-tower --images-dir /tmp/vision-images
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 tests/peers/vision_preprocess_bench.py /tmp/vision-images

Needs `pip install transformers pillow numpy` (no torch). Per image: decode (Image.open, RGB,
load), the processor (smart resize, bicubic, rescale, normalize, patches), medians of 9, in ms
and ms per input megapixel; prints a markdown table and a RESULT json line.
"""
import json
import os
import statistics
import sys
import time

from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor


def main():
    folder = sys.argv[1]
    # transformers' defaults for Qwen2.5-VL's processor, as `ProcessorConfig::default()`.
    processor = Qwen2VLImageProcessor(
        min_pixels=56 * 56, max_pixels=28 * 28 * 1280, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    names = sorted(
        (f for f in os.listdir(folder) if f.endswith((".png", ".jpg"))),
        key=lambda f: (f.rsplit(".", 1)[1], int(f.split("x")[0])),
    )
    print("| image | format | MP | decode ms | processor ms | total ms | ms per MP | without decode |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    results = []
    for name in names:
        path = os.path.join(folder, name)
        dec, proc = [], []
        for _ in range(9):
            t = time.perf_counter()
            img = Image.open(path).convert("RGB")
            img.load()
            t1 = time.perf_counter()
            out = processor(images=[img], return_tensors="np")
            t2 = time.perf_counter()
            dec.append(t1 - t)
            proc.append(t2 - t1)
        d, p = statistics.median(dec) * 1e3, statistics.median(proc) * 1e3
        w, h = img.size
        mp = w * h / 1e6
        size, fmt = name.rsplit(".", 1)
        print(f"| {size} | {fmt} | {mp:.2f} | {d:.1f} | {p:.1f} | {d + p:.1f} | {(d + p) / mp:.2f} | {p / mp:.2f} |")
        results.append(
            {"image": size, "format": fmt, "decode_ms": d, "processor_ms": p, "patches": int(out["pixel_values"].shape[0])}
        )
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
