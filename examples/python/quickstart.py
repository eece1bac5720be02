"""mlajit quick start: one DeepSeek-V3.2 sparse-attention layer step from Python on a GPU.

store (indexer K cache, fp8 + latent KV cache, bf16) -> lightning indexer (top-2048) -> sparse MLA
prefill, then the results checked against plain torch on a few tokens.

    pip install ./python          # builds libmlajit (or MLAJIT_LIBRARY=build/libmlajit.so)
    python examples/python/quickstart.py

Needs torch with CUDA and an sm_80+ GPU (the prefill's fastest kernels need sm_90a).
"""
import torch

import mlajit

PAGE, LAYERS, LAYER = 64, 2, 1
TOP_K, H_IDX, H = 2048, 64, 128

# ---- the specs: made once (compiled on first use, then served from the disk cache) -------------
K_STORE = mlajit.Op({"op": "kv_cache_store", "params": {
    "dtype": "fp8_e4m3", "num_heads": 1, "head_size": 128, "page_size": PAGE, "is_mla": True,
    "num_layers": LAYERS, "quantization_granularity": 128, "scale_fmt": "ue8m0"}})
KV_STORE = mlajit.Op({"op": "kv_cache_store", "params": {
    "dtype": "bf16", "num_heads": 1, "head_size": 576, "page_size": PAGE, "is_mla": True, "num_layers": LAYERS}})
INDEXER = mlajit.Op({"op": "mla_indexer", "params": {
    "num_heads": H_IDX, "depth": 128, "top_k": TOP_K, "page_size": PAGE, "quantization_granularity": 128,
    "mask": "causal", "emit": "physical"}})          # physical: encoded indices, what the prefill reads
PREFILL = mlajit.Op({"op": "sparse_prefill", "params": {
    "kv_dtype": "bf16", "num_q_heads": H, "page_size": PAGE, "attn_sink": False, "emit_lse": True}})


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    new, cached = [100, 60], [3000, 2500]             # new tokens and tokens already cached, per sequence
    T, B = sum(new), len(new)
    offsets = torch.tensor([0, new[0], T], dtype=torch.int64).to(torch.uint32).to(dev)
    cache_lengths = torch.tensor(cached, dtype=torch.int64).to(torch.uint32).to(dev)
    pages = -(-max(c + n for c, n in zip(cached, new)) // PAGE)
    num_blocks = B * pages + 4
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))[: B * pages].reshape(B, pages)
    lut = perm.to(torch.uint32).to(dev)                # u32 tensors are made on the host, then moved

    # Paged caches [num_blocks, kv_dim, num_layers, page_size, num_heads, head_size]; the history is random.
    k_cache = (torch.randn(num_blocks, 1, LAYERS, PAGE, 1, 128, generator=g, device=dev) * 0.3).to(torch.float8_e4m3fn)
    k_scales = torch.rand(num_blocks, 1, LAYERS, PAGE, 1, 1, generator=g, device=dev)
    kv_cache = torch.randn(num_blocks, 1, LAYERS, PAGE, 1, 576, generator=g, device=dev).to(torch.bfloat16)

    # This step's inputs.
    x_k = torch.randn(T, 1, 128, generator=g, device=dev).to(torch.bfloat16)          # indexer keys
    x_kv = torch.randn(T, 1, 576, generator=g, device=dev).to(torch.bfloat16)         # latent KV
    q_idx = (torch.randn(T, H_IDX, 128, generator=g, device=dev) * 0.5).to(torch.float8_e4m3fn)
    w_idx = torch.rand(T, H_IDX, generator=g, device=dev)                             # head weights
    q = torch.randn(T, H, 576, generator=g, device=dev).to(torch.bfloat16)
    max_keys = max(c + n for c, n in zip(cached, new))

    # ---- the layer step ------------------------------------------------------------------------
    mlajit.ops.kv_cache_store(K_STORE, x_k, offsets, k_cache, lut, cache_lengths, scales=k_scales, layer_idx=LAYER)
    mlajit.ops.kv_cache_store(KV_STORE, x_kv, offsets, kv_cache, lut, cache_lengths, layer_idx=LAYER)
    idx = mlajit.ops.mla_indexer(INDEXER, q_idx, w_idx, offsets, k_cache, k_scales, lut, cache_lengths,
                                 layer_idx=LAYER, max_keys_per_seq=max_keys)       # i32[T, 2048], -1 = no key
    topk_lengths = torch.full((T,), TOP_K, dtype=torch.int64).to(torch.uint32).to(dev)
    scale = 576 ** -0.5
    out, lse = mlajit.ops.sparse_prefill(PREFILL, q, kv_cache, idx, topk_lengths,  # i32 indices taken as they are
                                         softmax_scale=scale, layer_idx=LAYER)
    torch.cuda.synchronize()
    print(f"mlajit {mlajit.__version__}: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}")

    # ---- check a few tokens against plain torch ------------------------------------------------
    seq_of = [b for b in range(B) for _ in range(new[b])]
    lut_l = perm.to(dev)                                          # int64 copy of the table
    k_l = k_cache[:, 0, LAYER, :, 0].double()                     # [num_blocks, page, 128]
    ks_l = k_scales[:, 0, LAYER, :, 0, 0].double()                # [num_blocks, page]
    kv_l = kv_cache[:, 0, LAYER, :, 0].double()                   # [num_blocks, page, 576]
    worst_overlap, worst_err = 1.0, 0.0
    for t in [0, new[0] - 1, new[0], T - 1]:
        b, i = seq_of[t], t - (new[0] if seq_of[t] else 0)
        visible = cached[b] + i + 1                                 # causal
        pos = torch.arange(visible, device=dev)
        enc = lut_l[b, pos // PAGE] * PAGE + pos % PAGE             # encoded index of each visible key
        blk, off = enc // PAGE, enc % PAGE
        s = ks_l[blk, off] * (torch.relu(q_idx[t].double() @ k_l[blk, off].T) * w_idx[t, :, None].double()).sum(0)
        want = set(enc[torch.topk(s, min(TOP_K, visible)).indices].tolist())
        got = set(v for v in idx[t].tolist() if v >= 0)
        worst_overlap = min(worst_overlap, len(want & got) / len(want))   # fp8 near-ties may swap

        sel = idx[t][idx[t] >= 0].long()
        kv = kv_l[sel // PAGE, sel % PAGE]                         # [k, 576]
        p = torch.softmax(scale * (q[t].double() @ kv.T), dim=-1)
        ref = p @ kv[:, :512]
        err = ((out[t].double() - ref).norm() / ref.norm()).item()
        worst_err = max(worst_err, err)
    print(f"indexer: top-k overlap with torch >= {worst_overlap:.4f}; prefill: relative error <= {worst_err:.2e}")
    assert worst_overlap > 0.99 and worst_err < 1e-2, "mismatch against torch"
    print("OK")


if __name__ == "__main__":
    main()
