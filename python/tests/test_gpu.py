"""On a GPU: every op from Python on torch tensors against the C API called directly (bit for
bit), a torch.compile(fullgraph=True) store -> indexer -> prefill pipeline, the same pipeline in a
CUDA graph, the capture-miss error, and the host overhead per call (printed). Skips visibly
without torch or a GPU."""
import ctypes
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch not installed: GPU tests skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: GPU tests skipped", allow_module_level=True)

import mlajit  # noqa: E402
from mlajit._lib import lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE, LAYERS, NB = 64, 2, 24
K_STORE = {"op": "kv_cache_store", "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 128, "page_size": PAGE,
                                              "is_mla": True, "num_layers": LAYERS, "quantization_granularity": 128,
                                              "scale_fmt": "ue8m0", "input_dtype": "bf16"}}
KV_STORE = {"op": "kv_cache_store", "params": {"dtype": "bf16", "num_heads": 1, "head_size": 576, "page_size": PAGE,
                                               "is_mla": True, "num_layers": LAYERS, "input_dtype": "bf16"}}
KV8_STORE = {"op": "kv_cache_store", "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576,
                                                "page_size": PAGE, "is_mla": True, "num_layers": LAYERS,
                                                "quantization_granularity": 64, "scale_fmt": "fp32",
                                                "input_dtype": "bf16"}}
GATHER = {"op": "kv_cache_gather", "params": dict(KV8_STORE["params"], output_dtype="bf16")}
del GATHER["params"]["input_dtype"]
REMAP = {"op": "sparse_index_remap", "params": {"page_size": PAGE}}
INDEXER = {"op": "mla_indexer", "params": {"num_heads": 64, "depth": 128, "top_k": 2048, "page_size": PAGE,
                                           "quantization_granularity": 128, "mask": "causal", "emit": "physical"}}
PREFILL = {"op": "sparse_prefill", "params": {"kv_dtype": "bf16", "num_q_heads": 128, "b_topk": 64, "page_size": PAGE,
                                              "attn_sink": False, "emit_lse": True}}
# Ops made once, outside compiled functions (torch.compile takes an Op or a JSON string).
K_STORE_OP, KV_STORE_OP, INDEXER_OP, PREFILL_OP = (mlajit.Op(s) for s in (K_STORE, KV_STORE, INDEXER, PREFILL))


# ---- the C API called directly, with ctypes.Structure (independent of mlajit._tensor) ---------
class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 6), ("strides", ctypes.c_int64 * 6)]


class CCache(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("lookup_table", ctypes.c_void_p),
                ("cache_lengths", ctypes.c_void_p)]


CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float8_e4m3fn: 3, torch.uint32: 4, torch.int32: 5}
_keep = []


def ct(t):
    if t is None:
        return None
    c = CTensor(t.data_ptr(), CODES[t.dtype], t.dim(), (ctypes.c_int64 * 6)(*t.shape), (ctypes.c_int64 * 6)())
    _keep.append(c)
    return ctypes.addressof(c)


def cc(blocks, scales=None, lut=None, lens=None):
    c = CCache(ct(blocks), ct(scales), ct(lut), ct(lens))
    _keep.append(c)
    return ctypes.addressof(c)


def op_handle(spec):
    return mlajit.get_op(spec).handle


def stream():
    return torch.cuda.current_stream().cuda_stream


def check(status):
    assert status == 0, lib.mlajit_last_error().decode()


# ---- test data --------------------------------------------------------------------------------
def batch(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    seqs, cached = [37, 150], [70, 200]  # new tokens and cached tokens per sequence
    T = sum(seqs)
    offs = torch.tensor([0, seqs[0], T], dtype=torch.int64).to(torch.uint32).to(dev)
    lens = torch.tensor(cached, dtype=torch.int64).to(torch.uint32).to(dev)
    pages = -(-max(c + s for c, s in zip(cached, seqs)) // PAGE)
    perm = torch.randperm(NB, generator=torch.Generator().manual_seed(seed))[: 2 * pages].reshape(2, pages)
    lut = perm.to(torch.uint32).to(dev)
    d = dict(T=T, offs=offs, lens=lens, lut=lut, max_keys=max(c + s for c, s in zip(cached, seqs)))
    d["lengths"] = torch.full((T,), 2048, dtype=torch.int64).to(torch.uint32).to(dev)
    d["xk"] = torch.randn(T, 1, 128, generator=g, device=dev).to(torch.bfloat16)
    d["xkv"] = torch.randn(T, 1, 576, generator=g, device=dev).to(torch.bfloat16)
    d["q"] = (torch.randn(T, 64, 128, generator=g, device=dev) * 0.5).to(torch.float8_e4m3fn)
    d["qs"] = torch.rand(T, 64, generator=g, device=dev)
    d["qp"] = torch.randn(T, 128, 576, generator=g, device=dev).to(torch.bfloat16)
    # Caches hold earlier tokens too (random content stands for the history).
    d["kb"] = (torch.randn(NB, 1, LAYERS, PAGE, 1, 128, generator=g, device=dev) * 0.3).to(torch.float8_e4m3fn)
    d["ks"] = torch.rand(NB, 1, LAYERS, PAGE, 1, 1, generator=g, device=dev)
    d["kvb"] = torch.randn(NB, 1, LAYERS, PAGE, 1, 576, generator=g, device=dev).to(torch.bfloat16)
    return d


def clone_caches(d):
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in d.items()}


def pipeline(d, layer=1):
    mlajit.ops.kv_cache_store(K_STORE_OP, d["xk"], d["offs"], d["kb"], d["lut"], d["lens"], scales=d["ks"],
                              layer_idx=layer)
    mlajit.ops.kv_cache_store(KV_STORE_OP, d["xkv"], d["offs"], d["kvb"], d["lut"], d["lens"], layer_idx=layer)
    idx = mlajit.ops.mla_indexer(INDEXER_OP, d["q"], d["qs"], d["offs"], d["kb"], d["ks"], d["lut"], d["lens"],
                                 layer_idx=layer, max_keys_per_seq=d["max_keys"])
    out, lse = mlajit.ops.sparse_prefill(PREFILL_OP, d["qp"], d["kvb"], idx, d["lengths"],
                                         softmax_scale=576 ** -0.5, layer_idx=layer)
    return idx, out, lse


def pipeline_c(d, layer=1):
    s = stream()
    T = d["T"]
    check(lib.mlajit_kv_cache_store(op_handle(K_STORE), ct(d["xk"]), ct(d["offs"]), cc(d["kb"], d["ks"], d["lut"],
                                    d["lens"]), layer, 0, None, s))
    check(lib.mlajit_kv_cache_store(op_handle(KV_STORE), ct(d["xkv"]), ct(d["offs"]), cc(d["kvb"], None, d["lut"],
                                    d["lens"]), layer, 0, None, s))
    n = ctypes.c_size_t()
    check(lib.mlajit_mla_indexer_workspace_bytes(op_handle(INDEXER), T, d["max_keys"], ctypes.byref(n)))
    ws = torch.empty(n.value, dtype=torch.uint8, device="cuda").view(torch.int32) if n.value % 4 == 0 else \
        torch.empty((n.value + 3) // 4, dtype=torch.int32, device="cuda")
    idx = torch.empty(T, 2048, dtype=torch.int32, device="cuda")
    check(lib.mlajit_mla_indexer(op_handle(INDEXER), ct(d["q"]), ct(d["qs"]), ct(d["offs"]),
                                 cc(d["kb"], d["ks"], d["lut"], d["lens"]), layer, d["max_keys"], ct(idx), ct(ws), s))
    lengths = torch.full((T,), 2048, dtype=torch.uint32, device="cuda")
    out = torch.empty(T, 128, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(T, 128, dtype=torch.float32, device="cuda")
    check(lib.mlajit_sparse_prefill(op_handle(PREFILL), ct(d["qp"]), cc(d["kvb"]), ct(idx.view(torch.uint32)),
                                    ct(lengths), layer, ctypes.c_float(576 ** -0.5), None, ct(out), ct(lse), s))
    return idx, out, lse


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_pipeline_matches_the_c_api_bit_for_bit():
    d = batch()
    a, b = clone_caches(d), clone_caches(d)
    ra = pipeline(a)
    rb = pipeline_c(b)
    torch.cuda.synchronize()
    for x, y in zip(ra, rb):
        assert same_bits(x, y)
    for k in ("kb", "ks", "kvb"):
        assert same_bits(a[k], b[k]), k
    assert not torch.equal(a["kvb"], d["kvb"])  # the store wrote something
    assert (ra[0][:, 0] >= 0).all()  # every token sees at least itself
    assert torch.isfinite(ra[2]).all()


def test_gather_and_remap_match_the_c_api():
    d = batch(1)
    kb8 = torch.zeros(NB, 1, LAYERS, PAGE, 1, 576, dtype=torch.float8_e4m3fn, device="cuda")
    sc8 = torch.zeros(NB, 1, LAYERS, PAGE, 1, 9, dtype=torch.float32, device="cuda")
    mlajit.ops.kv_cache_store(KV8_STORE, d["xkv"], d["offs"], kb8, d["lut"], d["lens"], scales=sc8)
    kb8c, sc8c = torch.zeros_like(kb8), torch.zeros_like(sc8)
    check(lib.mlajit_kv_cache_store(op_handle(KV8_STORE), ct(d["xkv"]), ct(d["offs"]),
                                    cc(kb8c, sc8c, d["lut"], d["lens"]), 0, 0, None, stream()))
    bids = torch.tensor([0] * 37 + [1] * 150, dtype=torch.int64).to(torch.uint32).cuda()
    pos = torch.cat([torch.arange(70, 107), torch.arange(200, 350)]).to(torch.uint32).cuda()
    dropped = torch.zeros(1, dtype=torch.uint32, device="cuda")
    y = mlajit.ops.kv_cache_gather(GATHER, kb8, d["lut"], bids, pos, scales=sc8, dropped=dropped)
    yc = torch.empty_like(y)
    check(lib.mlajit_kv_cache_gather(op_handle(GATHER), cc(kb8c, sc8c, d["lut"]), ct(bids), ct(pos), 0, 0,
                                     ct(yc), None, stream()))
    logical = torch.randint(-1, 300, (d["T"], 2048), dtype=torch.int32, device="cuda")
    r = mlajit.ops.sparse_index_remap(REMAP, logical, d["offs"], d["lut"], NB)
    rc = torch.empty_like(r)
    check(lib.mlajit_sparse_index_remap(op_handle(REMAP), ct(logical), ct(d["offs"]), ct(d["lut"]), NB, ct(rc),
                                        stream()))
    torch.cuda.synchronize()
    assert same_bits(kb8, kb8c) and same_bits(sc8, sc8c)
    assert same_bits(y, yc) and dropped.item() == 0
    assert (y.float() - d["xkv"].float()).abs().max() < 0.2  # fp8 round trip of what was stored
    assert same_bits(r, rc)


def test_staged_fp8_prefill_is_the_bf16_kernel_on_the_dequantized_cache():
    """params kv_staging bf16: the fp8 rows are staged as e4m3 * scale rounded once to bf16 and the
    bf16 kernel runs on them, so the result is bit-identical to the bf16 op on a cache dequantized
    the same way in torch; with the workspace allocated by mlajit, given, or through the C API."""
    g = torch.Generator(device="cuda").manual_seed(5)
    T, stride = 40, 256
    kv8 = (torch.randn(NB, 1, LAYERS, PAGE, 1, 576, generator=g, device="cuda") * 3).to(torch.float8_e4m3fn)
    sc = torch.rand(NB, 1, LAYERS, PAGE, 1, 9, generator=g, device="cuda") + 0.25
    deq = (kv8.float() * sc.repeat_interleave(64, dim=-1)).to(torch.bfloat16)
    q = torch.randn(T, 128, 576, generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, NB * PAGE, (T, stride), generator=g, device="cuda", dtype=torch.int32)
    idx[::3, 200:] = -1
    idx[1::5, :7] = NB * PAGE + 3  # out of range: skipped
    lengths = torch.randint(0, stride + 40, (T,), generator=g, device="cuda", dtype=torch.int32).view(torch.uint32)
    scale = 576 ** -0.5
    staged = mlajit.Op({"op": "sparse_prefill", "params": dict(PREFILL["params"], kv_dtype="fp8_e4m3",
                                                               quantization_granularity=64, kv_staging="bf16")})
    want_o, want_l = mlajit.ops.sparse_prefill(PREFILL_OP, q, deq, idx, lengths, softmax_scale=scale, layer_idx=1)
    o1, l1 = mlajit.ops.sparse_prefill(staged, q, kv8, idx, lengths, kv_scales=sc, softmax_scale=scale, layer_idx=1)
    n = mlajit.ops.prefill_workspace_bytes(staged, NB)
    staged_part = NB * PAGE * 1152 + (NB + 15) // 16 * 16  # then the tail split's 256 slots of 64 x 514 floats
    assert n == (staged_part + 255) // 256 * 256 + 256 * 64 * 514 * 4
    ws = torch.full(((n + 3) // 4,), -1, dtype=torch.int32, device="cuda")  # NaN rows, every flag set
    o2, l2 = mlajit.ops.sparse_prefill(staged, q, kv8, idx, lengths, kv_scales=sc, softmax_scale=scale, layer_idx=1,
                                       workspace=ws)
    o3 = torch.empty_like(o1)
    l3 = torch.empty_like(l1)
    ws.fill_(-1)
    check(lib.mlajit_sparse_prefill_ws(op_handle(staged), ct(q), cc(kv8, sc),
                                       ct(idx.view(torch.uint32)), ct(lengths), 1, ctypes.c_float(scale), None, ct(o3),
                                       ct(l3), ct(ws), stream()))
    torch.cuda.synchronize()
    assert not torch.isnan(want_o.float()).any()
    for o, l in ((o1, l1), (o2, l2), (o3, l3)):
        assert same_bits(o, want_o) and same_bits(l, want_l)
    # Smaller than the staged copy: a clear error naming it, nothing launched.
    with pytest.raises(mlajit.InvalidArgumentError, match="workspace size"):
        mlajit.ops.sparse_prefill(staged, q, kv8, idx, lengths, kv_scales=sc, softmax_scale=scale, layer_idx=1,
                                  workspace=ws[:staged_part // 4 - 4])


def test_prefill_tail_split_runs_in_the_workspace():
    """The bf16 kernel splits its last round of items over the GPU in the workspace's partial slots:
    20 tokens x 2 head tiles on an H100's 132 SMs run as 2 parts each. The workspace allocated by
    mlajit or given (poisoned) gives the same bits; without one (the C entry point without a
    workspace) the kernel runs unsplit and agrees to f32 rounding."""
    g = torch.Generator(device="cuda").manual_seed(9)
    T, stride = 20, 512
    kv = torch.randn(NB, 1, LAYERS, PAGE, 1, 576, generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn(T, 128, 576, generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, NB * PAGE, (T, stride), generator=g, device="cuda", dtype=torch.int32)
    idx[::4, 300:] = -1
    lengths = torch.randint(0, stride + 40, (T,), generator=g, device="cuda", dtype=torch.int32).view(torch.uint32)
    lengths[3] = 0
    scale = 576 ** -0.5
    n = mlajit.ops.prefill_workspace_bytes(PREFILL_OP, NB)
    assert n == 256 * 64 * 514 * 4
    o1, l1 = mlajit.ops.sparse_prefill(PREFILL_OP, q, kv, idx, lengths, softmax_scale=scale, layer_idx=1)
    ws = torch.full(((n + 3) // 4,), -1, dtype=torch.int32, device="cuda")  # NaN slots
    o2, l2 = mlajit.ops.sparse_prefill(PREFILL_OP, q, kv, idx, lengths, softmax_scale=scale, layer_idx=1,
                                       workspace=ws)
    o3 = torch.empty_like(o1)
    l3 = torch.empty_like(l1)
    check(lib.mlajit_sparse_prefill(op_handle(PREFILL), ct(q), cc(kv), ct(idx.view(torch.uint32)), ct(lengths), 1,
                                    ctypes.c_float(scale), None, ct(o3), ct(l3), stream()))
    torch.cuda.synchronize()
    assert same_bits(o1, o2) and same_bits(l1, l2)
    assert torch.isfinite(o1.float()).all() and not torch.isnan(l1).any()
    if torch.cuda.get_device_properties(0).major == 9:  # the split is the Hopper kernel's
        assert not same_bits(o1, o3)  # split: other roundings than the unsplit kernel
    rel = ((o1.float() - o3.float()).norm() / o3.float().norm()).item()
    assert rel < 4e-3, rel
    finite = torch.isfinite(l3)
    assert torch.equal(finite, torch.isfinite(l1))
    assert (l1[finite] - l3[finite]).abs().max().item() < 1e-5
    # On another stream (stream=): the workspace allocated here is recorded on that stream, so
    # torch does not reuse its memory before the launch there is done; same bits.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    o4, l4 = mlajit.ops.sparse_prefill(PREFILL_OP, q, kv, idx, lengths, softmax_scale=scale, layer_idx=1,
                                       stream=side.cuda_stream)
    junk = torch.full(((n + 3) // 4,), -1, dtype=torch.int32, device="cuda")  # would reuse a freed workspace
    side.synchronize()
    del junk
    assert same_bits(o1, o4) and same_bits(l1, l4)


def test_library_errors_reach_python():
    d = batch()
    with pytest.raises(mlajit.InvalidArgumentError, match=r"qs"):
        mlajit.ops.mla_indexer(INDEXER, d["q"], d["qs"][:, :32].contiguous(), d["offs"], d["kb"], d["ks"], d["lut"],
                               d["lens"], max_keys_per_seq=d["max_keys"])


def test_torch_compile_fullgraph_pipeline():
    d = batch(2)
    a, b = clone_caches(d), clone_caches(d)
    ref = pipeline(a)
    f = torch.compile(pipeline, fullgraph=True)
    got = f(b)
    torch.cuda.synchronize()
    for x, y in zip(ref, got):
        assert same_bits(x, y)
    assert same_bits(a["kvb"], b["kvb"]) and same_bits(a["kb"], b["kb"])


def test_cuda_graph_capture_and_replay():
    d = batch(3)
    a, b = clone_caches(d), clone_caches(d)
    ref = pipeline(a)  # also loads every kernel: capture compiles and loads nothing
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pipeline(clone_caches(b))  # warm-up on the side stream, as torch recommends
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        got = pipeline(b)
    g.replay()
    torch.cuda.synchronize()
    for x, y in zip(ref, got):
        assert same_bits(x, y)
    g.replay()  # replay is idempotent: the store rewrites the same bytes
    torch.cuda.synchronize()
    for x, y in zip(ref, got):
        assert same_bits(x, y)


def test_a_miss_during_capture_is_a_clear_error():
    spec = dict(REMAP, params={"page_size": 32})  # never launched before in this process
    d = batch(4)
    logical = torch.zeros(d["T"], 64, dtype=torch.int32, device="cuda")
    out = torch.empty_like(logical)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(mlajit.InvalidArgumentError, match="precompile or load before capture"):
        with torch.cuda.graph(g):
            mlajit.ops.sparse_index_remap(spec, logical, d["offs"], d["lut"], NB, out=out)
    # One eager call loads the variant this shape uses (knobs left to the heuristic/tuner are
    # resolved per shape bucket, so Op.load() alone suffices only when every knob is explicit).
    mlajit.ops.sparse_index_remap(spec, logical, d["offs"], d["lut"], NB, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mlajit.ops.sparse_index_remap(spec, logical, d["offs"], d["lut"], NB, out=out)
    g.replay()
    torch.cuda.synchronize()


def test_host_overhead_per_call(capsys):
    """Host time per call of the raw C API, mlajit.ops and torch.ops.mlajit in this process
    (scripts/python_overhead.py; medians, printed)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import python_overhead

    med, where = python_overhead.measure(calls=2000, rounds=9)
    with capsys.disabled():
        print("\n" + python_overhead.report(med, where))
    # The target is <= 5 us added per mlajit.ops call. Absolute times move with the host's load,
    # so the check is relative: it catches regressions (the ctypes path measured ~3.9x the C API).
    assert med["mlajit.ops"] < 2.5 * med["c_api"]


# ---- layout fp8_ds_mla: FlashMLA's V3.2 fp8 latent records ------------------------------------
DS_STORE = {"op": "kv_cache_store", "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576,
                                               "page_size": PAGE, "is_mla": True, "num_layers": LAYERS,
                                               "quantization_granularity": 128, "scale_fmt": "ue8m0",
                                               "layout": "fp8_ds_mla", "input_dtype": "bf16"}}
DS_GATHER = {"op": "kv_cache_gather", "params": dict(DS_STORE["params"], output_dtype="bf16")}
del DS_GATHER["params"]["input_dtype"]


def flashmla_quantize(x):
    """FlashMLA's tests/quant.py quantize_k_cache (V32_FP8Sparse) on rows x bf16[T, 576] -> u8[T, 656]."""
    out = torch.empty(x.shape[0], 656, dtype=torch.uint8, device=x.device)
    out[:, 528:] = x[:, 512:].contiguous().view(torch.uint8)
    scales = torch.empty(x.shape[0], 4, dtype=torch.float32, device=x.device)
    for t in range(4):
        tile = x[:, t * 128:(t + 1) * 128]
        s = tile.abs().max(dim=-1).values.float() / 448.0
        s = torch.pow(2, torch.clamp_min(s, 1e-4).log2().ceil())
        scales[:, t] = s
        out[:, t * 128:(t + 1) * 128] = (tile.float() / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8)
    out[:, 512:528] = scales.view(torch.uint8)
    return out


def flashmla_dequantize(rec):
    """FlashMLA's dequantize_k_cache (V32_FP8Sparse) on records u8[T, 656] -> bf16[T, 576]."""
    y = torch.empty(rec.shape[0], 576, dtype=torch.bfloat16, device=rec.device)
    y[:, 512:] = rec[:, 528:].contiguous().view(torch.bfloat16)
    s = rec[:, 512:528].contiguous().view(torch.float32)
    for t in range(4):
        y[:, t * 128:(t + 1) * 128] = rec[:, t * 128:(t + 1) * 128].view(torch.float8_e4m3fn).float() * s[:, t:t + 1]
    return y


def test_fp8_ds_mla_records_match_flashmla_quantizer():
    d = batch(3)
    x = d["xkv"].clone()
    x[::5, 0, 128:256] = 0  # zero tiles
    x[1::5, 0, 256:384] *= 1e-3  # below the 1e-4 clamp
    x[2::5, 0, 7] = 56.0  # amax 448 * 2^-3: a power-of-two scale
    layer = 1
    blocks = torch.zeros(NB, 1, LAYERS, PAGE, 656, dtype=torch.uint8, device="cuda")
    dropped = torch.zeros(1, dtype=torch.uint32, device="cuda")
    mlajit.ops.kv_cache_store(DS_STORE, x, d["offs"], blocks, d["lut"], d["lens"], layer_idx=layer, dropped=dropped)
    blocks_c = torch.zeros_like(blocks)
    check(lib.mlajit_kv_cache_store(op_handle(DS_STORE), ct(x), ct(d["offs"]),
                                    cc(blocks_c.view(torch.float8_e4m3fn), None, d["lut"], d["lens"]), layer, 0, None,
                                    stream()))
    bids = torch.tensor([0] * 37 + [1] * 150, dtype=torch.int64).cuda()
    pos = torch.cat([torch.arange(70, 107), torch.arange(200, 350)]).cuda()
    blk = d["lut"].long()[bids, pos // PAGE]
    torch.cuda.synchronize()
    assert dropped.item() == 0
    assert torch.equal(blocks, blocks_c)
    rec = blocks[blk, 0, layer, pos % PAGE]
    assert torch.equal(rec, flashmla_quantize(x[:, 0]))
    assert int((blocks[:, 0, 0] != 0).sum()) == 0  # the other layer untouched
    y = mlajit.ops.kv_cache_gather(DS_GATHER, blocks, d["lut"], bids.to(torch.uint32), pos.to(torch.uint32),
                                   layer_idx=layer)
    torch.cuda.synchronize()
    assert same_bits(y[:, 0], flashmla_dequantize(rec))
    # One layer: vLLM's [num_blocks, page_size, 656].
    one = {"op": "kv_cache_store", "params": dict(DS_STORE["params"], num_layers=1)}
    b1 = torch.zeros(NB, PAGE, 656, dtype=torch.uint8, device="cuda")
    mlajit.ops.kv_cache_store(one, x, d["offs"], b1, d["lut"], d["lens"])
    torch.cuda.synchronize()
    assert torch.equal(b1[blk, pos % PAGE], rec)


def test_indexer_reads_the_engines_k_pages():
    """k_layout fp8_page_scales: kv_cache_store writes the engines' pages (each page's 128-byte
    e4m3 keys, then their f32 scales; checked against pages built by hand from the split store),
    and the indexer reads them to the same selection as from the split layout."""
    d = batch(5)
    layer = 1
    ps_store = {"op": "kv_cache_store", "params": dict(K_STORE["params"], layout="fp8_page_scales")}
    ps_indexer = {"op": "mla_indexer", "params": dict(INDEXER["params"], k_layout="fp8_page_scales")}
    pages = torch.zeros(NB, 1, LAYERS, PAGE, 132, dtype=torch.uint8, device="cuda")
    # The history: the split cache's bytes laid out as pages, then this step's tokens stored twice.
    kb8, ks8 = d["kb"].view(torch.uint8).reshape(NB * LAYERS, PAGE * 128), d["ks"].reshape(NB * LAYERS, PAGE)
    pages.view(NB * LAYERS, PAGE * 132).copy_(torch.cat([kb8, ks8.contiguous().view(torch.uint8)], dim=1))
    mlajit.ops.kv_cache_store(K_STORE_OP, d["xk"], d["offs"], d["kb"], d["lut"], d["lens"], scales=d["ks"],
                              layer_idx=layer)
    mlajit.ops.kv_cache_store(ps_store, d["xk"], d["offs"], pages, d["lut"], d["lens"], layer_idx=layer)
    kb8, ks8 = d["kb"].view(torch.uint8).reshape(NB * LAYERS, PAGE * 128), d["ks"].reshape(NB * LAYERS, PAGE)
    want = torch.cat([kb8, ks8.contiguous().view(torch.uint8)], dim=1)
    assert torch.equal(pages.view(NB * LAYERS, PAGE * 132), want)
    split = mlajit.ops.mla_indexer(INDEXER_OP, d["q"], d["qs"], d["offs"], d["kb"], d["ks"], d["lut"], d["lens"],
                                   layer_idx=layer, max_keys_per_seq=d["max_keys"])
    paged = mlajit.ops.mla_indexer(ps_indexer, d["q"], d["qs"], d["offs"], pages, None, d["lut"], d["lens"],
                                   layer_idx=layer, max_keys_per_seq=d["max_keys"])
    assert torch.equal(split, paged)
