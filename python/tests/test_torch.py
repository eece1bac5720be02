"""torch integration without a GPU: the custom ops exist with their mutations declared, and the
ops produce the right output shapes under FakeTensorMode (what torch.compile traces with)."""
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: torch custom-op tests skipped")
import mlajit  # noqa: E402

INDEXER = {"op": "mla_indexer", "params": {"num_heads": 64, "depth": 128, "top_k": 2048, "page_size": 64,
                                           "quantization_granularity": 128, "mask": "causal", "emit": "physical"}}
PREFILL = {"op": "sparse_prefill", "params": {"kv_dtype": "bf16", "num_q_heads": 128, "b_topk": 64, "page_size": 64,
                                              "attn_sink": False, "emit_lse": True}}
GATHER = {"op": "kv_cache_gather", "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576, "page_size": 64,
                                              "is_mla": True, "num_layers": 2, "quantization_granularity": 64,
                                              "scale_fmt": "fp32", "output_dtype": "bf16"}}


def test_custom_ops_declare_mutations():
    for name, mutated in [("kv_cache_store", {"blocks", "scales", "dropped"}), ("kv_cache_gather", {"dropped"}),
                          ("sparse_index_remap", set()), ("mla_indexer", set()), ("sparse_prefill", set())]:
        schema = getattr(torch.ops.mlajit, name).default._schema
        got = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert got == mutated, (name, str(schema))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        dev = torch.device("cuda")
        T = 5
        q = torch.empty(T, 64, 128, dtype=torch.float8_e4m3fn, device=dev)
        qs = torch.empty(T, 64, dtype=torch.float32, device=dev)
        offs = torch.empty(3, dtype=torch.uint32, device=dev)
        kb = torch.empty(4, 1, 2, 64, 1, 128, dtype=torch.float8_e4m3fn, device=dev)
        ks = torch.empty(4, 1, 2, 64, 1, 1, dtype=torch.float32, device=dev)
        lut = torch.empty(2, 2, dtype=torch.uint32, device=dev)
        lens = torch.empty(2, dtype=torch.uint32, device=dev)
        idx = mlajit.ops.mla_indexer(INDEXER, q, qs, offs, kb, ks, lut, lens, max_keys_per_seq=256)
        assert idx.shape == (T, 2048) and idx.dtype == torch.int32
        remapped = mlajit.ops.sparse_index_remap({"op": "sparse_index_remap", "params": {"page_size": 64}}, idx, offs,
                                                 lut, 4)
        assert remapped.shape == (T, 2048) and remapped.dtype == torch.int32
        qp = torch.empty(T, 128, 576, dtype=torch.bfloat16, device=dev)
        kv = torch.empty(4, 1, 2, 64, 1, 576, dtype=torch.bfloat16, device=dev)
        out, lse = mlajit.ops.sparse_prefill(PREFILL, qp, kv, idx,
                                             torch.empty(T, dtype=torch.uint32, device=dev), softmax_scale=0.04)
        assert out.shape == (T, 128, 512) and out.dtype == torch.bfloat16
        assert lse.shape == (T, 128) and lse.dtype == torch.float32
        pos = torch.empty(7, dtype=torch.uint32, device=dev)
        y = mlajit.ops.kv_cache_gather(GATHER, kv.to(torch.float8_e4m3fn), lut, pos, pos,
                                       scales=torch.empty(4, 1, 2, 64, 1, 9, device=dev))
        assert y.shape == (7, 1, 576) and y.dtype == torch.bfloat16


def test_cpu_tensors_are_refused_with_a_clear_error():
    q = torch.zeros(1, 128, 576, dtype=torch.bfloat16)
    with pytest.raises(mlajit.InvalidArgumentError, match="expected a CUDA tensor"):
        mlajit.ops.sparse_prefill(PREFILL, q, torch.zeros(1, 1, 1, 64, 1, 576, dtype=torch.bfloat16),
                                  torch.zeros(1, 64, dtype=torch.uint32), torch.zeros(1, dtype=torch.uint32),
                                  softmax_scale=0.04)


def test_compile_fullgraph_traces_the_custom_ops():
    """torch.compile(fullgraph=True) of store -> indexer -> prefill puts the three torch.ops.mlajit
    ops in one graph. Run on CPU tensors, the compiled graph reaches the real implementation,
    which refuses them."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    store = mlajit.Op({"op": "kv_cache_store", "params": {"dtype": "bf16", "num_heads": 1, "head_size": 576,
                                                          "page_size": 64, "is_mla": True, "num_layers": 2}})
    indexer, prefill = mlajit.Op(INDEXER), mlajit.Op(PREFILL)

    def pipeline(x, offs, kv, lut, lens, q, qs, kb, ks, qp, lengths):
        mlajit.ops.kv_cache_store(store, x, offs, kv, lut, lens, layer_idx=1)
        idx = mlajit.ops.mla_indexer(indexer, q, qs, offs, kb, ks, lut, lens, layer_idx=1, max_keys_per_seq=256)
        return mlajit.ops.sparse_prefill(prefill, qp, kv, idx, lengths, softmax_scale=0.04, layer_idx=1)

    T, u32 = 5, torch.uint32
    args = (torch.zeros(T, 1, 576, dtype=torch.bfloat16), torch.zeros(3, dtype=u32),
            torch.zeros(4, 1, 2, 64, 1, 576, dtype=torch.bfloat16), torch.zeros(2, 2, dtype=u32),
            torch.zeros(2, dtype=u32), torch.zeros(T, 64, 128, dtype=torch.float8_e4m3fn), torch.zeros(T, 64),
            torch.zeros(4, 1, 2, 64, 1, 128, dtype=torch.float8_e4m3fn), torch.zeros(4, 1, 2, 64, 1, 1),
            torch.zeros(T, 128, 576, dtype=torch.bfloat16), torch.zeros(T, dtype=u32))
    compiled = torch.compile(pipeline, fullgraph=True, backend=backend)
    with pytest.raises(mlajit.InvalidArgumentError, match="expected a CUDA tensor"):
        compiled(*args)
    code = graphs[0].code
    assert "mlajit.kv_cache_store" in code and "mlajit.mla_indexer" in code and "mlajit.sparse_prefill" in code


def test_dynamo_takes_the_torch_ops_path_for_eager_tensors():
    """Under TorchDynamo the eager-path check is True, so CUDA tensors (which a GPU-less test cannot
    make) reach torch.ops.mlajit rather than the C extension, which dynamo cannot trace."""
    def probe(x):
        return x + (1 if mlajit.ops._is_dynamo_compiling() else 0)

    assert torch.compile(probe, fullgraph=True, backend="eager")(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert probe(torch.zeros(2)).tolist() == [0.0, 0.0]
