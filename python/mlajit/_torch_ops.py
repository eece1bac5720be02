"""torch.library registrations: torch.ops.mlajit.*, so mlajit ops trace under
torch.compile(fullgraph=True) and replay inside CUDA graphs.

The first argument is the op's canonical spec JSON (Op.json), a constant of the traced graph.
kv_cache_store mutates the cache (declared); the other ops are functional: they allocate their
outputs with torch (inside a CUDA graph that memory comes from the graph's pool) and their fake
implementations give the output shapes from the spec. sparse_prefill returns an empty lse when
the spec has emit_lse false (an op returns the same types always).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import ops as _ops
from ._core import get_op


@torch.library.custom_op("mlajit::kv_cache_store", mutates_args=("blocks", "scales", "dropped"))
def kv_cache_store(spec: str, x: Tensor, input_row_offsets: Tensor, blocks: Tensor, scales: Optional[Tensor],
                   lookup_table: Tensor, cache_lengths: Tensor, layer_idx: int, kv_idx: int,
                   dropped: Optional[Tensor]) -> None:
    _ops._store(get_op(spec, "kv_cache_store"), x, input_row_offsets, blocks, scales, lookup_table, cache_lengths,
                layer_idx, kv_idx, dropped, None)


@kv_cache_store.register_fake
def _(spec, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths, layer_idx, kv_idx, dropped):
    return None


@torch.library.custom_op("mlajit::kv_cache_gather", mutates_args=("dropped",))
def kv_cache_gather(spec: str, blocks: Tensor, scales: Optional[Tensor], lookup_table: Tensor,
                    cache_lengths: Optional[Tensor], batch_ids: Tensor, positions: Tensor, layer_idx: int,
                    kv_idx: int, dropped: Optional[Tensor]) -> Tensor:
    op = get_op(spec, "kv_cache_gather")
    y = _ops.gather_output(op, positions)
    _ops._gather(op, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, y, dropped,
                 None)
    return y


@kv_cache_gather.register_fake
def _(spec, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, dropped):
    return _ops.gather_output(get_op(spec, "kv_cache_gather"), positions)


@torch.library.custom_op("mlajit::sparse_index_remap", mutates_args=())
def sparse_index_remap(spec: str, indices: Tensor, input_row_offsets: Tensor, lookup_table: Tensor,
                       num_blocks: int) -> Tensor:
    out = torch.empty_like(indices)
    _ops._remap(get_op(spec, "sparse_index_remap"), indices, input_row_offsets, lookup_table, num_blocks, out, None)
    return out


@sparse_index_remap.register_fake
def _(spec, indices, input_row_offsets, lookup_table, num_blocks):
    return torch.empty_like(indices)


@torch.library.custom_op("mlajit::mla_indexer", mutates_args=())
def mla_indexer(spec: str, q: Tensor, qs: Tensor, input_row_offsets: Tensor, k_blocks: Tensor, k_scales: Tensor,
                k_lookup_table: Tensor, k_cache_lengths: Tensor, layer_idx: int, max_keys_per_seq: int) -> Tensor:
    op = get_op(spec, "mla_indexer")
    out = _ops.indexer_output(op, q)
    _ops._indexer(op, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
                  max_keys_per_seq, out, None, None)
    return out


@mla_indexer.register_fake
def _(spec, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, layer_idx,
      max_keys_per_seq):
    return _ops.indexer_output(get_op(spec, "mla_indexer"), q)


def _prefill_outputs(spec, q):
    out, lse = _ops.prefill_outputs(get_op(spec, "sparse_prefill"), q)
    return out, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op("mlajit::sparse_prefill", mutates_args=())
def sparse_prefill(spec: str, q: Tensor, kv_blocks: Tensor, kv_scales: Optional[Tensor], indices: Tensor,
                   topk_lengths: Tensor, layer_idx: int, softmax_scale: float,
                   attn_sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    out, lse = _prefill_outputs(spec, q)
    _ops._prefill(get_op(spec, "sparse_prefill"), q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx,
                  softmax_scale, attn_sink, out, lse if lse.numel() else None, None)
    return out, lse


@sparse_prefill.register_fake
def _(spec, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink):
    return _prefill_outputs(spec, q)
