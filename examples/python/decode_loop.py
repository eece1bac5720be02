"""mlajit decode loop: one DeepSeek-V3.2 sparse-attention layer over a paged cache, prefill then decode.

A ragged batch is prefilled with one launch per op (store indexer K, store the latent as FlashMLA's
656-byte fp8_ds_mla records, lightning indexer top-2048, sparse attention with sinks), then decoded
one token per sequence per step. One decode step is captured in a CUDA graph and replayed; the last
step (and a few prefill tokens) are checked against plain torch in float64.

    python examples/python/decode_loop.py [steps]

Needs torch with CUDA and an sm_90a GPU (the fp8_ds_mla records are read by the Hopper kernel only).
"""
import statistics
import sys

import torch

import mlajit

PAGE, LAYERS, LAYER = 64, 2, 1
TOP_K, H_IDX, H = 2048, 64, 128
SCALE = 576 ** -0.5
PROMPTS = [1500, 3000, 2200, 2737]      # ragged; 1500 + steps < 2048: that sequence's rows keep -1 slots

# ---- the specs -------------------------------------------------------------------------------
K_STORE = mlajit.Op({"op": "kv_cache_store", "params": {
    "dtype": "fp8_e4m3", "num_heads": 1, "head_size": 128, "page_size": PAGE, "is_mla": True,
    "num_layers": LAYERS, "quantization_granularity": 128, "scale_fmt": "ue8m0"}})
LATENT_STORE = mlajit.Op({"op": "kv_cache_store", "params": {   # FlashMLA's V32_FP8Sparse records
    "dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576, "page_size": PAGE, "is_mla": True,
    "num_layers": LAYERS, "quantization_granularity": 128, "scale_fmt": "ue8m0", "layout": "fp8_ds_mla"}})
INDEXER = mlajit.Op({"op": "mla_indexer", "params": {
    "num_heads": H_IDX, "depth": 128, "top_k": TOP_K, "page_size": PAGE, "quantization_granularity": 128,
    "mask": "causal", "emit": "physical"}})          # encoded indices: what the attention reads as they are
# One op for prefill and decode: with fewer query tokens than SMs it splits each token's keys over
# the GPU and merges the parts (the decode plan), in the partial slots of its workspace.
ATTENTION = mlajit.Op({"op": "sparse_prefill", "params": {
    "kv_dtype": "fp8_e4m3", "quantization_granularity": 128, "scale_fmt": "ue8m0", "kv_layout": "fp8_ds_mla",
    "num_q_heads": H, "page_size": PAGE, "attn_sink": True, "emit_lse": True}})


def u32(values, dev):
    """torch lacks some uint32 CUDA ops: u32 tensors are made on the host, then moved."""
    return torch.tensor(values, dtype=torch.int64).to(torch.uint32).to(dev)


def new_tokens(T, g, dev):
    """One layer's per-token inputs for T new tokens (what the model's projections would give)."""
    return {"xk": torch.randn(T, 1, 128, generator=g, device=dev).to(torch.bfloat16),      # indexer key
            "xkv": torch.randn(T, 1, 576, generator=g, device=dev).to(torch.bfloat16),     # latent + rope
            "q_idx": (torch.randn(T, H_IDX, 128, generator=g, device=dev) * 0.5).to(torch.float8_e4m3fn),
            "w_idx": torch.rand(T, H_IDX, generator=g, device=dev),                        # head weights
            "q": torch.randn(T, H, 576, generator=g, device=dev).to(torch.bfloat16)}


def dequantize_records(rec):
    """fp8_ds_mla records u8[n, 656] -> f64[n, 576]: e4m3 x its tile's f32 scale, then the bf16 rope."""
    lat = rec[:, :512].contiguous().view(torch.float8_e4m3fn).double().view(-1, 4, 128)
    scales = rec[:, 512:528].contiguous().view(torch.float32).double()               # [n, 4]
    rope = rec[:, 528:].contiguous().view(torch.bfloat16).double()                   # [n, 64]
    return torch.cat([(lat * scales[:, :, None]).view(-1, 512), rope], dim=1)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    if torch.cuda.get_device_capability() != (9, 0):
        sys.exit("needs an sm_90a GPU: kv_layout fp8_ds_mla is read by the Hopper kernel only")
    dev, B = "cuda", len(PROMPTS)
    g = torch.Generator(device=dev).manual_seed(0)

    # Page table: every sequence owns pages for its prompt and all decode steps, shuffled over a
    # pool with a few blocks no sequence uses.
    max_len = max(PROMPTS) + steps
    pages = -(-max_len // PAGE)
    num_blocks = B * pages + 8
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))[: B * pages].reshape(B, pages)
    lut = perm.to(torch.uint32).to(dev)

    # Caches [num_blocks, 1, num_layers, page, ...]. What the steps do not write stays random (random
    # bytes in the records, NaN included), so a read of a wrong row, page or layer shows up.
    k_blocks = (torch.randn(num_blocks, 1, LAYERS, PAGE, 1, 128, generator=g, device=dev) * 0.3).to(torch.float8_e4m3fn)
    k_scales = torch.rand(num_blocks, 1, LAYERS, PAGE, 1, 1, generator=g, device=dev)
    records = torch.randint(0, 256, (num_blocks, 1, LAYERS, PAGE, 656), generator=g, device=dev, dtype=torch.uint8)
    sink = torch.randn(H, generator=g, device=dev)                  # f32[H], one sink logit per head
    dropped = u32([0], dev)                                         # tokens a store could not place
    # sparse_prefill's workspace, sized by the pool: reused by every launch on this stream.
    n = mlajit.ops.prefill_workspace_bytes(ATTENTION, num_blocks)
    ws_attn = torch.empty((n + 15) // 16 * 4, dtype=torch.int32, device=dev) if n else None

    # ---- prefill: the whole ragged batch, one launch per op ------------------------------------
    T0 = sum(PROMPTS)
    offs0 = u32([sum(PROMPTS[:b]) for b in range(B + 1)], dev)
    empty = u32([0] * B, dev)                                       # nothing cached before the prompts
    pre = new_tokens(T0, g, dev)
    mlajit.ops.kv_cache_store(K_STORE, pre["xk"], offs0, k_blocks, lut, empty, scales=k_scales, layer_idx=LAYER,
                              dropped=dropped)
    mlajit.ops.kv_cache_store(LATENT_STORE, pre["xkv"], offs0, records, lut, empty, layer_idx=LAYER, dropped=dropped)
    idx0 = mlajit.ops.mla_indexer(INDEXER, pre["q_idx"], pre["w_idx"], offs0, k_blocks, k_scales, lut, empty,
                                  layer_idx=LAYER, max_keys_per_seq=max(PROMPTS))
    out0, lse0 = mlajit.ops.sparse_prefill(ATTENTION, pre["q"], records, idx0, u32([TOP_K] * T0, dev),
                                           softmax_scale=SCALE, attn_sink=sink, layer_idx=LAYER, workspace=ws_attn)

    # ---- decode: static tensors, so one captured step serves every step -------------------------
    offs = u32(list(range(B + 1)), dev)                             # one new token per sequence
    lens_i32 = torch.tensor(PROMPTS, dtype=torch.int32, device=dev)  # int32 storage: add_ works on it
    lens = lens_i32.view(torch.uint32)                              # the u32 view the ops read
    topk_len = u32([TOP_K] * B, dev)
    inputs = [new_tokens(B, g, dev) for _ in range(steps)]          # every step's tokens, made up front
    x = {k: v.clone() for k, v in inputs[0].items()}                # the graph's input tensors
    idx = torch.empty(B, TOP_K, dtype=torch.int32, device=dev)
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, H, dtype=torch.float32, device=dev)
    # The indexer's bound and scratch sized for the final length: keys past a sequence's current
    # length are not visible (causal), so the same values serve every step.
    max_keys = max_len
    n = mlajit.ops.indexer_workspace_bytes(INDEXER, B, max_keys)
    ws_idx = torch.empty((n + 15) // 16 * 4, dtype=torch.int32, device=dev)

    def decode_step():
        mlajit.ops.kv_cache_store(K_STORE, x["xk"], offs, k_blocks, lut, lens, scales=k_scales, layer_idx=LAYER,
                                  dropped=dropped)
        mlajit.ops.kv_cache_store(LATENT_STORE, x["xkv"], offs, records, lut, lens, layer_idx=LAYER, dropped=dropped)
        mlajit.ops.mla_indexer(INDEXER, x["q_idx"], x["w_idx"], offs, k_blocks, k_scales, lut, lens, layer_idx=LAYER,
                               max_keys_per_seq=max_keys, out=idx, workspace=ws_idx)
        mlajit.ops.sparse_prefill(ATTENTION, x["q"], records, idx, topk_len, softmax_scale=SCALE, attn_sink=sink,
                                  layer_idx=LAYER, out=out, lse=lse, workspace=ws_attn)

    # Step 0 runs eagerly on a side stream (torch's rule before capture): it compiles or loads every
    # kernel this shape uses, since mlajit refuses to compile while a stream is being captured.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                                   # records only: nothing runs here
        decode_step()

    times = []
    for s in range(1, steps):
        lens_i32.add_(1)                                            # the previous step's token is cached now
        for k, v in inputs[s].items():
            x[k].copy_(v)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    torch.cuda.synchronize()
    if times:
        print(f"mlajit {mlajit.__version__}: prefill {T0} tokens, then {steps} decode steps of {B} tokens; "
              f"decode step (graph replay): median {statistics.median(times):.1f} us over {len(times)} steps")

    # ---- check against plain torch (float64) --------------------------------------------------
    lut64 = perm.to(dev)
    kk = k_blocks[:, 0, LAYER, :, 0].double().reshape(-1, 128)      # row = encoded index
    ks = k_scales[:, 0, LAYER, :, 0, 0].double().reshape(-1)
    latent = dequantize_records(records[:, 0, LAYER].reshape(-1, 656))

    def compare(rows, inp, idx, out, lse):
        """rows: (row, sequence, visible keys). Indexer: overlap of its top-k set with torch's
        (near-ties may swap). Attention: torch over mlajit's own selection, so it is checked
        independently of those ties (SPEC §3 with the sink)."""
        overlap, num, den, dlse = 1.0, 0.0, 0.0, []
        for r, b, n in rows:
            pos = torch.arange(n, device=dev)
            enc = lut64[b, pos // PAGE] * PAGE + pos % PAGE
            relu = torch.relu(inp["q_idx"][r].double() @ kk[enc].T)                 # [H_idx, n]
            score = ks[enc] * (relu * inp["w_idx"][r, :, None].double()).sum(0)    # SPEC §2
            want = enc[torch.topk(score, min(TOP_K, n)).indices]
            got = idx[r][idx[r] >= 0].long()
            overlap = min(overlap, torch.isin(want, got).sum().item() / max(len(want), len(got)))
            kv = latent[got]                                        # [k, 576]
            logits = SCALE * (inp["q"][r].double() @ kv.T)         # [H, k]
            m = logits.max(dim=1, keepdim=True).values
            e = torch.exp(logits - m)
            l = e.sum(dim=1, keepdim=True)
            ref = (e @ kv[:, :512]) / (l + torch.exp(sink.double()[:, None] - m))
            num += (out[r].double() - ref).square().sum().item()
            den += ref.square().sum().item()
            dlse.append((lse[r].double() - (m + l.log()).squeeze(1)).abs().max())
        return overlap, (num / den) ** 0.5, torch.stack(dlse).max().item()   # NaN propagates: fails

    final = [p + steps - 1 for p in PROMPTS]                        # the last step's token positions
    results = {"decode, last step": compare([(b, b, final[b] + 1) for b in range(B)], x, idx, out, lse)}
    starts = [sum(PROMPTS[:b]) for b in range(B)]
    rows = [(starts[b] + i, b, i + 1) for b in range(B) for i in (700, PROMPTS[b] - 1)]
    results[f"prefill, {len(rows)} tokens"] = compare(rows, pre, idx0, out0, lse0)
    ok = dropped.item() == 0
    for name, (overlap, err, dl) in results.items():
        print(f"{name}: indexer top-k overlap >= {overlap:.4f}; attention out rel. error {err:.2e}, "
              f"|lse diff| <= {dl:.2e}")
        ok = ok and overlap >= 0.99 and err < 1e-2 and dl < 1e-3
    if not ok:
        sys.exit(f"FAILED: mismatch against torch (dropped tokens: {dropped.item()})")
    print("OK")


if __name__ == "__main__":
    main()
