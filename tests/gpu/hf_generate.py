"""HF transformers `generate()` on the same GPU and shapes as `lmi bench engine --device cuda`:
prompt of --prompt-len random tokens per sequence, then --decode-steps greedy tokens, for each
batch size; prints decode ms per step and tokens/s (the comparison the benchmark reports).
Usage: hf_generate.py MODEL_DIR [--batch 1,8,64,256] [--prompt-len 128] [--decode-steps 16]"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,8,64,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=16)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    print("| batch | prefill tok/s | decode step ms | decode tok/s |")
    print("|---:|---:|---:|---:|")
    for b in [int(x) for x in a.batch.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(b)
        ids = torch.randint(0, vocab, (b, a.prompt_len), device="cuda", generator=g)
        mask = torch.ones_like(ids)

        def run(new: int) -> float:
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                )
            torch.cuda.synchronize()
            return time.perf_counter() - t

        run(2)  # warm-up
        prefill = min(run(1) for _ in range(3))
        full = min(run(a.decode_steps + 1) for _ in range(3))
        step = (full - prefill) / a.decode_steps
        print(f"| {b} | {b * a.prompt_len / prefill:.0f} | {step * 1e3:.2f} | {b / step:.1f} |")


if __name__ == "__main__":
    main()
