"""torch.library registrations: torch.ops.mlajit.*, so mlajit ops trace under
torch.compile(fullgraph=True) and replay inside CUDA graphs.

The first argument is the op's canonical spec JSON (Op.json), a constant of the traced graph.
kv_cache_store mutates the cache (declared in its schema); the other ops are functional: they
allocate their outputs with torch (inside a CUDA graph that memory comes from the graph's pool) and
their fake implementations give the output shapes from the spec. sparse_prefill returns an empty
lse when the spec has emit_lse false (an op returns the same types always).

The ops are defined with torch.library.Library (a schema and one CompositeExplicitAutograd kernel)
rather than torch.library.custom_op: custom_op wraps every call in Python-level autograd, aliasing
and version-counter kernels (about 3-4x the dispatch time of this registration, measured with
scripts/python_overhead.py), which inference kernels do not need. The schemas are the ones
custom_op inferred (SymInt, mutations as Tensor(a!)), so graphs and auto-functionalization see the
same ops.
"""
import torch

from ._launch import impl as _launch
from . import ops as _ops
from ._core import get_op

_cuda_device = _ops.cuda_device

_SCHEMAS = {
    "kv_cache_store": "(str spec, Tensor x, Tensor input_row_offsets, Tensor(a3!) blocks, Tensor(a4!)? scales, "
                      "Tensor lookup_table, Tensor cache_lengths, SymInt layer_idx, SymInt kv_idx, "
                      "Tensor(a9!)? dropped) -> ()",
    "kv_cache_gather": "(str spec, Tensor blocks, Tensor? scales, Tensor lookup_table, Tensor? cache_lengths, "
                       "Tensor batch_ids, Tensor positions, SymInt layer_idx, SymInt kv_idx, Tensor(a9!)? dropped) "
                       "-> Tensor",
    "sparse_index_remap": "(str spec, Tensor indices, Tensor input_row_offsets, Tensor lookup_table, "
                          "SymInt num_blocks) -> Tensor",
    "mla_indexer": "(str spec, Tensor q, Tensor qs, Tensor input_row_offsets, Tensor k_blocks, Tensor? k_scales, "
                   "Tensor k_lookup_table, Tensor k_cache_lengths, SymInt layer_idx, SymInt max_keys_per_seq) "
                   "-> Tensor",
    "sparse_prefill": "(str spec, Tensor q, Tensor kv_blocks, Tensor? kv_scales, Tensor indices, Tensor topk_lengths, "
                      "SymInt layer_idx, float softmax_scale, Tensor? attn_sink) -> (Tensor, Tensor)",
}

_library = torch.library.Library("mlajit", "DEF")  # kept alive: the registrations live as long as it


def _register(name, real, fake):
    _library.define(name + _SCHEMAS[name], tags=(torch.Tag.pt2_compliant_tag,))
    _library.impl(name, real, "CompositeExplicitAutograd")
    torch.library.register_fake(f"mlajit::{name}", fake, lib=_library)


# ---- real implementations (any torch tensor reaches them; CPU ones are refused with a message) ---


def _store(spec, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths, layer_idx, kv_idx, dropped):
    _launch.kv_cache_store(get_op(spec, "kv_cache_store").handle, _cuda_device(x), None, x, input_row_offsets, blocks,
                           scales, lookup_table, cache_lengths, layer_idx, kv_idx, dropped)


def _gather(spec, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, dropped):
    op = get_op(spec, "kv_cache_gather")
    device = _cuda_device(positions)
    y = _ops.gather_output(op, positions)
    _launch.kv_cache_gather(op.handle, device, None, blocks, scales, lookup_table, cache_lengths, batch_ids,
                            positions, layer_idx, kv_idx, y, dropped)
    return y


def _remap(spec, indices, input_row_offsets, lookup_table, num_blocks):
    op = get_op(spec, "sparse_index_remap")
    device = _cuda_device(indices)
    out = torch.empty_like(indices)
    _launch.sparse_index_remap(op.handle, device, None, indices, input_row_offsets, lookup_table, num_blocks, out)
    return out


def _indexer(spec, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
             max_keys_per_seq):
    op = get_op(spec, "mla_indexer")
    device = _cuda_device(q)
    out = _ops.indexer_output(op, q)
    _launch.mla_indexer(op.handle, device, None, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table,
                        k_cache_lengths, layer_idx, max_keys_per_seq, out,
                        _ops.indexer_workspace(op, q, max_keys_per_seq))
    return out


def _prefill_outputs(spec, q):
    out, lse = _ops.prefill_outputs(get_op(spec, "sparse_prefill"), q)
    return out, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


def _prefill(spec, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink):
    op = get_op(spec, "sparse_prefill")
    device = _cuda_device(q)
    out, lse = _prefill_outputs(spec, q)
    _launch.sparse_prefill(op.handle, device, None, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx,
                           softmax_scale, attn_sink, out, lse if lse.numel() else None,
                           _ops.prefill_workspace(op, kv_blocks))
    return out, lse


# ---- fake implementations (shapes and dtypes from the spec) -------------------------------------


def _store_fake(spec, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths, layer_idx, kv_idx, dropped):
    return None


def _gather_fake(spec, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, dropped):
    return _ops.gather_output(get_op(spec, "kv_cache_gather"), positions)


def _remap_fake(spec, indices, input_row_offsets, lookup_table, num_blocks):
    return torch.empty_like(indices)


def _indexer_fake(spec, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
                  max_keys_per_seq):
    return _ops.indexer_output(get_op(spec, "mla_indexer"), q)


def _prefill_fake(spec, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink):
    return _prefill_outputs(spec, q)


_register("kv_cache_store", _store, _store_fake)
_register("kv_cache_gather", _gather, _gather_fake)
_register("sparse_index_remap", _remap, _remap_fake)
_register("mla_indexer", _indexer, _indexer_fake)
_register("sparse_prefill", _prefill, _prefill_fake)
