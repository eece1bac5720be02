"""The ops on tensors: mlajit.ops.kv_cache_store / kv_cache_gather / sparse_index_remap /
mla_indexer / sparse_prefill.

Each takes the op's spec first (an Op, a {"op", "params"} dict or its JSON), then tensors as in
docs/SPEC.md (torch tensors; objects with __cuda_array_interface__ or __dlpack__ work without the
torch custom-op features). Launches go to torch's current stream of the tensors' device (or
`stream=`, a CUstream as int). Outputs that are not given are allocated (torch). Validation is the
library's: a bad shape raises mlajit.InvalidArgumentError with the C++ message.

Eager calls on CUDA torch tensors go straight to the C API through the C extension
mlajit._fastcall (see _launch.py): reading each tensor's dtype, shape, strides and pointer
through torch's Python attributes is most of the few microseconds a call adds to the C call
(scripts/python_overhead.py measures it). Under torch.compile or with fake tensors the same
functions go through the torch custom ops torch.ops.mlajit.* (see _torch_ops.py), which declare
their mutated arguments and have fake implementations.
"""
import ctypes

from . import _tensor
from ._core import Op, get_op
from ._launch import impl as _launch
from ._lib import InvalidArgumentError, check, lib
from ._tensor import torch

_size_t = ctypes.c_size_t

if torch is not None:
    _is_compiling = torch.compiler.is_compiling
    # Per eager call only TorchDynamo tracing matters (make_fx and export see fake tensors, which
    # take the torch.ops path by type); is_dynamo_compiling is a fraction of is_compiling's cost.
    _is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)
    _Tensor = torch.Tensor
else:
    _Tensor = None


def _eager_device(t):
    """Where an eager call on t launches: its CUDA device (a plain torch tensor), -1 (another array
    object: the legacy default stream unless stream= is given), or None when the call must go
    through torch.ops.mlajit (tracing, and fake, meta, CPU, other-device or subclass tensors)."""
    if type(t) is _Tensor:
        return t.get_device() if t.is_cuda and not _is_dynamo_compiling() else None
    if torch is None:
        return -1
    return None if isinstance(t, _Tensor) or _is_dynamo_compiling() else -1


def _scratch_in_use_on(scratch, stream, device):
    """A workspace allocated here from torch's current stream but used by a launch on another
    CUstream (stream=): torch's caching allocator must not hand its memory out again before that
    stream is done with it."""
    if scratch is not None and stream is not None and device >= 0:
        scratch.record_stream(torch.cuda.ExternalStream(int(stream), device=device))


def cuda_device(t):
    """t's CUDA device index (the custom ops' real implementations run on any torch tensor)."""
    if not t.is_cuda:
        raise InvalidArgumentError(f"tensor device: got {t.device}, expected a CUDA tensor")
    return t.get_device()


def _empty(shape, dtype_name, like):
    return torch.empty(shape, dtype=_tensor.TORCH_OF[_tensor.DTYPE_NAMES[dtype_name]], device=like.device)


def indexer_workspace_bytes(spec, total_tokens, max_keys_per_seq):
    """Bytes of scratch mla_indexer needs for this batch (it is allocated when not given)."""
    op = get_op(spec, "mla_indexer")
    key = (total_tokens, max_keys_per_seq)
    n = op.workspace_bytes.get(key)
    if n is None:
        size = _size_t()
        check(lib.mlajit_mla_indexer_workspace_bytes(op.handle, total_tokens, max_keys_per_seq, ctypes.byref(size)))
        n = size.value
        if len(op.workspace_bytes) > 256:  # a pure function of the key: a bounded memo
            op.workspace_bytes.clear()
        op.workspace_bytes[key] = n
    return n


def indexer_workspace(op, q, max_keys_per_seq):
    """The indexer's scratch for q's batch (torch), or None when it needs none."""
    n = indexer_workspace_bytes(op, q.shape[0], max_keys_per_seq)
    return torch.empty((n + 3) // 4, dtype=torch.int32, device=q.device) if n else None


def prefill_workspace_bytes(spec, num_blocks):
    """Bytes of scratch sparse_prefill uses on a latent cache of num_blocks blocks (allocated per
    call when not given): with params kv_staging "bf16" the staged bf16 copy of the selected fp8 rows
    (required), and for the persistent Hopper kernel (a bf16 cache, or kv_staging "bf16") the
    partial slots of its tail split (~33.7 MB; without them the kernel runs unsplit). 0 for the
    other specs."""
    op = get_op(spec, "sparse_prefill")
    key = ("sparse_prefill", num_blocks)
    n = op.workspace_bytes.get(key)
    if n is None:
        size = _size_t()
        check(lib.mlajit_sparse_prefill_workspace_bytes(op.handle, num_blocks, ctypes.byref(size)))
        n = size.value
        if len(op.workspace_bytes) > 256:  # a pure function of the key: a bounded memo
            op.workspace_bytes.clear()
        op.workspace_bytes[key] = n
    return n


def prefill_workspace(op, kv_blocks):
    """sparse_prefill's scratch for a cache (torch), or None when the op uses none."""
    n = prefill_workspace_bytes(op, kv_blocks.shape[0])
    return torch.empty((n + 15) // 16 * 4, dtype=torch.int32, device=kv_blocks.device) if n else None


def _key(spec):
    """The spec as the custom ops take it (a str, a constant of a traced graph)."""
    if isinstance(spec, Op):
        return spec.json
    if isinstance(spec, str):
        return spec
    if _is_compiling():
        raise InvalidArgumentError("spec under torch.compile: got a dict, expected an mlajit.Op created outside the "
                                   "compiled function (or the spec's JSON string)")
    return get_op(spec).json


# ---- public ops ------------------------------------------------------------------------------
# Under torch.compile / fake tensors each op is one torch.ops.mlajit call that allocates its
# outputs (functional), so the traced graph holds no Python; an `out=` given is then filled by copy.


def kv_cache_store(spec, x, input_row_offsets, blocks, lookup_table, cache_lengths, *, scales=None, layer_idx=0,
                   kv_idx=0, dropped=None, stream=None):
    """Writes x[T, num_heads, head_size] into the paged cache (blocks, and scales for fp8) at each
    token's logical position (SPEC §1). dropped: optional u32[1] counter of tokens not written.
    params layout "fp8_ds_mla": blocks are uint8 records [num_blocks, 1, num_layers, page_size, 656]
    (with one layer also [num_blocks, page_size, 656]) and scales is None."""
    device = _eager_device(x)
    if device is None:
        torch.ops.mlajit.kv_cache_store(_key(spec), x, input_row_offsets, blocks, scales, lookup_table, cache_lengths,
                                        layer_idx, kv_idx, dropped)
        return
    _launch.kv_cache_store(get_op(spec, "kv_cache_store").handle, device, stream, x, input_row_offsets, blocks, scales,
                           lookup_table, cache_lengths, layer_idx, kv_idx, dropped)


def kv_cache_gather(spec, blocks, lookup_table, batch_ids, positions, *, scales=None, cache_lengths=None,
                    layer_idx=0, kv_idx=0, y=None, dropped=None, stream=None):
    """Dense y[T, num_heads, head_size] (output_dtype) of (batch_ids, positions) pairs; returns y.
    params layout "fp8_ds_mla": blocks as for kv_cache_store, scales None."""
    device = _eager_device(positions)
    if device is None:
        r = torch.ops.mlajit.kv_cache_gather(_key(spec), blocks, scales, lookup_table, cache_lengths, batch_ids,
                                             positions, layer_idx, kv_idx, dropped)
        return r if y is None else y.copy_(r)
    op = get_op(spec, "kv_cache_gather")
    if y is None:
        y = gather_output(op, positions)
    _launch.kv_cache_gather(op.handle, device, stream, blocks, scales, lookup_table, cache_lengths, batch_ids,
                            positions, layer_idx, kv_idx, y, dropped)
    return y


def sparse_index_remap(spec, indices, input_row_offsets, lookup_table, num_blocks, *, out=None, stream=None):
    """Logical top-k indices i32[T, k] -> encoded indices i32[T, k] (SPEC §1); returns out."""
    device = _eager_device(indices)
    if device is None:
        r = torch.ops.mlajit.sparse_index_remap(_key(spec), indices, input_row_offsets, lookup_table, num_blocks)
        return r if out is None else out.copy_(r)
    op = get_op(spec, "sparse_index_remap")
    if out is None:
        out = _empty(tuple(indices.shape), "i32", indices)
    _launch.sparse_index_remap(op.handle, device, stream, indices, input_row_offsets, lookup_table, num_blocks, out)
    return out


def mla_indexer(spec, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, *,
                max_keys_per_seq, layer_idx=0, out=None, workspace=None, stream=None):
    """Top-k key positions i32[T, top_k] per new token (SPEC §2); returns out. max_keys_per_seq: an
    upper bound of cache_length + new tokens over the batch (sizes the workspace, which is
    allocated from torch when not given). params k_layout "fp8_page_scales": k_blocks are the
    engines' uint8 pages [num_blocks, 1, num_layers, page_size, 132] (or one layer's
    [num_blocks, page_size, 132], DeepGEMM's [num_blocks, page_size, 1, 132]), k_scales None."""
    device = _eager_device(q)
    if device is None:
        r = torch.ops.mlajit.mla_indexer(_key(spec), q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table,
                                         k_cache_lengths, layer_idx, max_keys_per_seq)
        return r if out is None else out.copy_(r)
    op = get_op(spec, "mla_indexer")
    if out is None:
        out = indexer_output(op, q)
    own = workspace is None
    if own:
        workspace = indexer_workspace(op, q, max_keys_per_seq)
    _launch.mla_indexer(op.handle, device, stream, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table,
                        k_cache_lengths, layer_idx, max_keys_per_seq, out, workspace)
    if own:
        _scratch_in_use_on(workspace, stream, device)
    return out


def sparse_prefill(spec, q, kv_blocks, indices, topk_lengths, *, softmax_scale, kv_scales=None, layer_idx=0,
                   attn_sink=None, out=None, lse=None, workspace=None, stream=None):
    """Sparse MLA prefill (SPEC §3): returns (out bf16[T, H, 512], lse f32[T, H]; None without
    emit_lse, an empty tensor under torch.compile). indices: u32[T, stride] encoded indices, or the
    i32 output of mla_indexer with emit=physical (read as u32: the same bits, -1 = invalid).
    workspace: device scratch of prefill_workspace_bytes(spec, kv_blocks.shape[0]) bytes, 16-byte
    aligned (allocated per call when not given; pass one to reuse it, e.g. across layers, and for
    CUDA-graph capture). kv_staging "bf16" requires its staged part; the rest holds the partial
    slots with which the sm_90a kernels split items over keys: decode (fewer tokens x head tiles
    than SMs) splits every token's keys over the GPU, a long launch its last wave. Launches that
    may overlap (other streams) must not share one.
    Decode is this op on batch x next_n query rows. kv_layout "fp8_ds_mla": kv_blocks are the
    uint8 records [num_blocks, 1, num_layers, page_size, 656] of a layout "fp8_ds_mla" cache.
    Under torch.compile (the torch.ops.mlajit path) the custom op allocates its own per call and a
    given workspace is not used."""
    device = _eager_device(q)
    if device is None:
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
    own = workspace is None
    if own:
        workspace = prefill_workspace(op, kv_blocks)
    _launch.sparse_prefill(op.handle, device, stream, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx,
                           softmax_scale, attn_sink, out, lse, workspace)
    if own:
        _scratch_in_use_on(workspace, stream, device)
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
