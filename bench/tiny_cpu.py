"""What the tiny model costs on this CPU, in the two places the transformers engine chooses:

1. dtype: a 4 x 1,000-token prompt batch, generate() for 1 and for 60 new tokens, float32 and
   bfloat16 (prefill is the 1-token figure; decoding the difference);
2. batch buckets: six requests of mixed prompt lengths, as the quickstart's roles arrive together
   (four searcher turns of 1,000-2,300 tokens, two short questions), answered by one engine batch
   with bucketing off (PADDING_SLACK huge: one generate() call) and on (the default).

Not a test: prints seconds. `python bench/tiny_cpu.py [--parts dtype,buckets] [--repeat N]`
"""

from __future__ import annotations

import argparse
import time

import cts.serving.transformers_engine as te
from cts.serving.tiny_model import prepare_tiny
from cts.serving.types import ChatRequest, Message, Sampling

WORDS = "the battery life of the earbuds is eight hours and charging takes one hour "


def dtype_part(path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    enc = tok(["hello " * 1000] * 4, return_tensors="pt")
    for dtype in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        for new in (1, 60):
            started = time.perf_counter()
            with torch.inference_mode():
                model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            print(f"dtype {dtype}: 4 x 1000 prompt tokens, {new} new: "
                  f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip


def buckets_part(path: str, repeat: int) -> None:
    engine = te.TransformersEngine("tiny", path, dtype=te.resolve_dtype("auto"))
    engine.load()

    def request(repeats: int, max_tokens: int) -> ChatRequest:
        return ChatRequest(
            messages=(Message(role="user", content=WORDS * repeats),),
            sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        )

    requests = [request(100, 140), request(150, 140), request(70, 110), request(80, 140)]
    requests += [request(6, 30), request(6, 30)]
    default = te.PADDING_SLACK
    for _ in range(repeat):
        for slack in (1e9, default):
            te.PADDING_SLACK = slack
            started = time.perf_counter()
            engine._run_batch(requests)
            sizes = [len(b) for b in engine._buckets(requests, list(range(len(requests))))]
            label = "off (one call)" if slack > 100 else f"on (slack {slack})"
            print(f"buckets {label}: {time.perf_counter() - started:.1f} s, "
                  f"generate() calls of {sizes} requests", flush=True)  # fmt: skip
    te.PADDING_SLACK = default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="dtype,buckets", help="dtype, buckets or both")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the buckets part")
    args = parser.parse_args()
    path = str(prepare_tiny(log=False))
    print(f"native bfloat16 here: {te.native_bf16()}; dtype auto -> {te.resolve_dtype('auto')}")
    parts = args.parts.split(",")
    if "dtype" in parts:
        dtype_part(path)
    if "buckets" in parts:
        buckets_part(path, args.repeat)


if __name__ == "__main__":
    main()
