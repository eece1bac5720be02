"""The ops on tensors: mlajit.ops.kv_cache_store / kv_cache_gather / sparse_index_remap /
mla_indexer / sparse_prefill.

Each takes the op's spec first (an Op, a {"op", "params"} dict or its JSON), then tensors as in
docs/SPEC.md (torch tensors; objects with __cuda_array_interface__ or __dlpack__ work without the
torch custom-op features). Launches go to torch's current stream of the tensors' device (or
`stream=`, a CUstream as int). Outputs that are not given are allocated (torch). Validation is the
library's: a bad shape raises mlajit.InvalidArgumentError with the C++ message.

Eager calls go straight to the C API (a few microseconds of host time). Under torch.compile or
with fake tensors the same functions go through the torch custom ops torch.ops.mlajit.* (see
_torch_ops.py), which declare their mutated arguments and have fake implementations.
"""
import ctypes

from . import _tensor
from ._core import Op, get_op
from ._lib import check, lib
from ._tensor import Pack, torch

_size_t = ctypes.c_size_t
_current_device = [-1]

if torch is not None:
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _is_compiling = torch.compiler.is_compiling
    _Tensor = torch.Tensor
else:
    _raw_stream = None


def _stream_of(t, stream):
    """The CUstream for a launch on tensor t's device, making that device current for mlajit."""
    if stream is not None:
        return stream
    if torch is None or not isinstance(t, _Tensor):
        return None  # legacy default stream
    dev = t.get_device()  # -1 for CPU tensors; cheaper than t.device.index
    if dev < 0:
        raise _invalid(f"tensor device: got {t.device}, expected a CUDA tensor")
    if dev != _current_device[0]:
        check(lib.mlajit_set_device(dev))
        _current_device[0] = dev
    if _raw_stream is not None:
        return _raw_stream(dev)
    return torch.cuda.current_stream(dev).cuda_stream


def _invalid(msg):
    from ._lib import InvalidArgumentError

    return InvalidArgumentError(msg)


def _via_torch(t):
    """Whether a call must go through torch.ops.mlajit: tracing, or fake/meta/subclass tensors."""
    if torch is None:
        return False
    if type(t) is _Tensor:
        return not t.is_cuda or _is_compiling()
    return isinstance(t, _Tensor) or _is_compiling()


def _empty(shape, dtype_name, like):
    return torch.empty(shape, dtype=_tensor.TORCH_OF[_tensor.DTYPE_NAMES[dtype_name]], device=like.device)


# ---- raw launches (shared by the eager path and the custom ops' real implementations) ---------


def _store(op, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths, layer_idx, kv_idx, dropped, stream):
    p = Pack(6, 1)
    check(lib.mlajit_kv_cache_store(op.handle, p.tensor(x), p.tensor(input_row_offsets),
                                    p.cache(blocks, scales, lookup_table, cache_lengths), layer_idx, kv_idx,
                                    p.tensor(dropped), _stream_of(x, stream)))


def _gather(op, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, y, dropped,
            stream):
    p = Pack(8, 1)
    check(lib.mlajit_kv_cache_gather(op.handle, p.cache(blocks, scales, lookup_table, cache_lengths),
                                     p.tensor(batch_ids), p.tensor(positions), layer_idx, kv_idx, p.tensor(y),
                                     p.tensor(dropped), _stream_of(y, stream)))


def _remap(op, indices, input_row_offsets, lookup_table, num_blocks, out, stream):
    p = Pack(4)
    check(lib.mlajit_sparse_index_remap(op.handle, p.tensor(indices), p.tensor(input_row_offsets),
                                        p.tensor(lookup_table), num_blocks, p.tensor(out), _stream_of(out, stream)))


def indexer_workspace_bytes(spec, total_tokens, max_keys_per_seq):
    """Bytes of scratch mla_indexer needs for this batch (it is allocated when not given)."""
    n = _size_t()
    check(lib.mlajit_mla_indexer_workspace_bytes(get_op(spec, "mla_indexer").handle, total_tokens, max_keys_per_seq,
                                                 ctypes.byref(n)))
    return n.value


def _indexer(op, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
             max_keys_per_seq, out, workspace, stream):
    if workspace is None:
        n = _size_t()
        check(lib.mlajit_mla_indexer_workspace_bytes(op.handle, q.shape[0], max_keys_per_seq, ctypes.byref(n)))
        if n.value:
            workspace = torch.empty((n.value + 3) // 4, dtype=torch.int32, device=out.device)
    p = Pack(9, 1)
    check(lib.mlajit_mla_indexer(op.handle, p.tensor(q), p.tensor(qs), p.tensor(input_row_offsets),
                                 p.cache(k_blocks, k_scales, k_lookup_table, k_cache_lengths), layer_idx,
                                 max_keys_per_seq, p.tensor(out), p.tensor(workspace), _stream_of(out, stream)))


def _prefill(op, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, out, lse,
             stream):
    p = Pack(8, 1)
    check(lib.mlajit_sparse_prefill(op.handle, p.tensor(q), p.cache(kv_blocks, kv_scales), p.tensor(indices, True),
                                    p.tensor(topk_lengths), layer_idx, softmax_scale, p.tensor(attn_sink),
                                    p.tensor(out), p.tensor(lse), _stream_of(out, stream)))


def _key(spec):
    """The spec as the custom ops take it (a str, a constant of a traced graph)."""
    if isinstance(spec, Op):
        return spec.json
    if isinstance(spec, str):
        return spec
    if _is_compiling():
        raise _invalid("spec under torch.compile: got a dict, expected an mlajit.Op created outside the compiled "
                       "function (or the spec's JSON string)")
    return get_op(spec).json


# ---- public ops ------------------------------------------------------------------------------
# Under torch.compile / fake tensors each op is one torch.ops.mlajit call that allocates its
# outputs (functional), so the traced graph holds no Python; an `out=` given is then filled by copy.


def kv_cache_store(spec, x, input_row_offsets, blocks, lookup_table, cache_lengths, *, scales=None, layer_idx=0,
                   kv_idx=0, dropped=None, stream=None):
    """Writes x[T, num_heads, head_size] into the paged cache (blocks, and scales for fp8) at each
    token's logical position (SPEC §1). dropped: optional u32[1] counter of tokens not written."""
    if _via_torch(x):
        torch.ops.mlajit.kv_cache_store(_key(spec), x, input_row_offsets, blocks, scales, lookup_table, cache_lengths,
                                        layer_idx, kv_idx, dropped)
        return
    _store(get_op(spec, "kv_cache_store"), x, input_row_offsets, blocks, scales, lookup_table, cache_lengths,
           layer_idx, kv_idx, dropped, stream)


def kv_cache_gather(spec, blocks, lookup_table, batch_ids, positions, *, scales=None, cache_lengths=None,
                    layer_idx=0, kv_idx=0, y=None, dropped=None, stream=None):
    """Dense y[T, num_heads, head_size] (output_dtype) of (batch_ids, positions) pairs; returns y."""
    if _via_torch(positions):
        r = torch.ops.mlajit.kv_cache_gather(_key(spec), blocks, scales, lookup_table, cache_lengths, batch_ids,
                                             positions, layer_idx, kv_idx, dropped)
        return r if y is None else y.copy_(r)
    op = get_op(spec, "kv_cache_gather")
    if y is None:
        y = gather_output(op, positions)
    _gather(op, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, y, dropped,
            stream)
    return y


def sparse_index_remap(spec, indices, input_row_offsets, lookup_table, num_blocks, *, out=None, stream=None):
    """Logical top-k indices i32[T, k] -> encoded indices i32[T, k] (SPEC §1); returns out."""
    if _via_torch(indices):
        r = torch.ops.mlajit.sparse_index_remap(_key(spec), indices, input_row_offsets, lookup_table, num_blocks)
        return r if out is None else out.copy_(r)
    op = get_op(spec, "sparse_index_remap")
    if out is None:
        out = _empty(tuple(indices.shape), "i32", indices)
    _remap(op, indices, input_row_offsets, lookup_table, num_blocks, out, stream)
    return out


def mla_indexer(spec, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, *,
                max_keys_per_seq, layer_idx=0, out=None, workspace=None, stream=None):
    """Top-k key positions i32[T, top_k] per new token (SPEC §2); returns out. max_keys_per_seq: an
    upper bound of cache_length + new tokens over the batch (sizes the workspace, which is
    allocated from torch when not given)."""
    if _via_torch(q):
        r = torch.ops.mlajit.mla_indexer(_key(spec), q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table,
                                         k_cache_lengths, layer_idx, max_keys_per_seq)
        return r if out is None else out.copy_(r)
    op = get_op(spec, "mla_indexer")
    if out is None:
        out = indexer_output(op, q)
    _indexer(op, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
             max_keys_per_seq, out, workspace, stream)
    return out


def sparse_prefill(spec, q, kv_blocks, indices, topk_lengths, *, softmax_scale, kv_scales=None, layer_idx=0,
                   attn_sink=None, out=None, lse=None, stream=None):
    """Sparse MLA prefill (SPEC §3): returns (out bf16[T, H, 512], lse f32[T, H]; None without
    emit_lse, an empty tensor under torch.compile). indices: u32[T, stride] encoded indices, or the
    i32 output of mla_indexer with emit=physical (read as u32: the same bits, -1 = invalid)."""
    if _via_torch(q):
        o, l = torch.ops.mlajit.sparse_prefill(_key(spec), q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx,
                                               float(softmax_scale), attn_sink)
        if out is not None:
            o = out.copy_(o)
        if lse is not None:
            l = lse.copy_(l)
        return o, l
    op = get_op(spec, "sparse_prefill")
    if out is None:
        out, lse_new = prefill_outputs(op, q)
        lse = lse if lse is not None else lse_new
    elif lse is None and op.params.get("emit_lse", True):
        lse = prefill_outputs(op, q)[1]
    _prefill(op, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, out, lse,
             stream)
    return out, lse


# ---- output allocation (shared with the custom ops' real and fake implementations) ------------


def gather_output(op, positions):
    pr = op.params
    return _empty((positions.shape[0], pr["num_heads"], pr["head_size"]), pr.get("output_dtype", "bf16"), positions)


def indexer_output(op, q):
    return _empty((q.shape[0], op.params["top_k"]), "i32", q)


def prefill_outputs(op, q):
    pr = op.params
    out = _empty((q.shape[0], q.shape[1], 512), pr.get("output_dtype", "bf16"), q)
    lse = _empty((q.shape[0], q.shape[1]), "f32", q) if pr.get("emit_lse", True) else None
    return out, lse
