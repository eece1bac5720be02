#!/usr/bin/env python3
"""Top-k baseline beside the indexer: DeepGEMM-style fp8 MQA logits from an anchor library
(C ABI: src/ops/mla_indexer/bench.hpp; the library is given, never built here) followed by
torch.topk, timed on one sequence of T new tokens after s_kv - T cached (causal), H heads, top-k.

usage: anchor_topk_baseline.py LIB.so [--heads 64] [--new 4096] [--s-kv 8192,32768,65536] [--k 2048]
Prints one line per s_kv: anchor scores ms, masked torch.topk ms, their sum (medians over reps,
L2 flushed by a 256 MB write before each timed call)."""
import argparse
import ctypes

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--new", type=int, default=4096)
    ap.add_argument("--s-kv", default="8192,32768,65536")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    lib = ctypes.CDLL(a.lib)
    lib.anchor_mqa_logits.restype = ctypes.c_int
    lib.anchor_mqa_logits.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_longlong] + [ctypes.c_int] * 4 + [ctypes.c_void_p]
    lib.anchor_mqa_logits_stride.restype = ctypes.c_longlong
    lib.anchor_mqa_logits_stride.argtypes = [ctypes.c_int]
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    T, H = a.new, a.heads
    for skv in [int(x) for x in a.s_kv.split(",")]:
        g = torch.Generator(device=dev).manual_seed(skv)
        q = (torch.randn(T, H, 128, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
        k = (torch.randn(skv, 128, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
        ks = torch.rand((skv + 3) // 4 * 4 + 4, device=dev, generator=g) + 0.5
        w = torch.randn(T, H, device=dev, generator=g)
        cached = skv - T
        start = torch.zeros(T, dtype=torch.int32, device=dev)
        end = torch.arange(cached + 1, cached + T + 1, dtype=torch.int32, device=dev)
        stride = lib.anchor_mqa_logits_stride(skv)
        logits = torch.empty((T + 3) // 4 * 4, stride, dtype=torch.float32, device=dev)
        cols = torch.arange(skv, device=dev)
        invisible = cols[None, :] >= end[:, None].long()

        def scores():
            rc = lib.anchor_mqa_logits(q.data_ptr(), k.data_ptr(), ks.data_ptr(), w.data_ptr(), start.data_ptr(),
                                       end.data_ptr(), logits.data_ptr(), stride, T, skv, H, 128,
                                       torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise SystemExit(f"anchor_mqa_logits returned {rc}")

        view = logits[:T, :skv]

        def topk():
            # DeepGEMM's clean_logits step (-inf past each row's end) is part of the baseline top-k.
            view.masked_fill_(invisible, float("-inf"))
            return torch.topk(view, a.k, dim=-1)

        def timed(fn):
            flush.fill_(1)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e)

        for _ in range(2):
            scores()
            topk()
        ts, tk = [], []
        for _ in range(a.reps):
            ts.append(timed(scores))
            tk.append(timed(topk))
        med = lambda v: sorted(v)[len(v) // 2]
        pairs = sum(cached + i + 1 for i in range(T))
        tf = 2.0 * pairs * H * 128 / (med(ts) * 1e-3) / 1e12
        print(f"anchor+torch H {H} s_kv {skv}: anchor scores {med(ts):.3f} ms ({tf:.0f} TFLOP/s), "
              f"mask+torch.topk {med(tk):.3f} ms, sum {med(ts) + med(tk):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
