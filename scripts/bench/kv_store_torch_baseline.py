#!/usr/bin/env python3
"""Torch baseline of kv_cache_store at serving sizes: the same store written plainly in torch
(quantize to e4m3 with one f32 scale per `quantization_granularity` elements, or a plain bf16 copy, then
scatter rows into a paged cache through a slot mapping), timed per call like `mlajit bench`
(CUDA events around one call, median of reps, buffers rotated so that nothing is L2-warm).

usage: kv_store_torch_baseline.py [--tokens 1,16,128,512,4096] [--heads 1] [--head-size 576]
                                  [--dtype fp8|bf16] [--quantization-granularity 64] [--scale-fmt fp32|ue8m0]"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,16,128,512,4096")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--head-size", type=int, default=576)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--quantization-granularity", type=int, default=64)
    ap.add_argument("--scale-fmt", default="fp32")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    dev = torch.device("cuda")
    H, D, P = a.heads, a.head_size, a.page_size
    G = a.quantization_granularity if a.dtype == "fp8" else D
    for T in [int(x) for x in a.tokens.split(",")]:
        pages = (T + P - 1) // P
        sets = 4
        xs = [torch.randn(T, H, D, device=dev).to(torch.bfloat16) for _ in range(sets)]
        perm = torch.randperm(pages, device=dev)
        slots = (perm[torch.arange(T, device=dev) // P] * P + torch.arange(T, device=dev) % P).long()
        cache_dt = torch.uint8 if a.dtype == "fp8" else torch.bfloat16
        blocks = [torch.empty(pages * P, H, D, dtype=cache_dt, device=dev) for _ in range(sets)]
        scales = [torch.empty(pages * P, H, D // G, dtype=torch.float32, device=dev) for _ in range(sets)]

        def store(i):
            x = xs[i]
            if a.dtype != "fp8":
                blocks[i].index_copy_(0, slots, x)
                return
            xf = x.float().view(T, H, D // G, G)
            amax = xf.abs().amax(-1, keepdim=True)
            s = amax.clamp_min(1e-4) / 448.0  # mlajit's group scale (templates/kv_cache/kv_cache.cuh)
            if a.scale_fmt == "ue8m0":
                s = torch.exp2(torch.ceil(torch.log2(s)))
            q = (xf / s).to(torch.float8_e4m3fn).view(torch.uint8).view(T, H, D)
            blocks[i].index_copy_(0, slots, q)
            scales[i].index_copy_(0, slots, s.view(T, H, D // G))

        for i in range(3):
            store(i % sets)
        torch.cuda.synchronize()
        ms = []
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(a.reps):
            st.record()
            store(r % sets)
            en.record()
            en.synchronize()
            ms.append(st.elapsed_time(en))
        ms.sort()
        print(f"torch kv_cache_store {a.dtype} H {H} D {D} g {G} tokens {T}: {ms[len(ms) // 2] * 1e3:.1f} us median "
              f"(min {ms[0] * 1e3:.1f})", flush=True)


if __name__ == "__main__":
    main()
