"""The eager launches through ctypes: the functions of the C extension mlajit._fastcall with the
same arguments, for a build without it (a Python without development headers). Slower by several
microseconds per call (argument structs packed in Python, ctypes converting each argument)."""
import threading

from ._lib import check, lib
from ._tensor import Pack

_raw_stream = None  # set by _launch: device -> torch's current CUstream of that device
_thread = threading.local()  # the C API makes a device current per thread


def _context(device, stream):
    if device >= 0 and getattr(_thread, "device", -1) != device:
        check(lib.mlajit_set_device(device))
        _thread.device = device
    if stream is None and device >= 0 and _raw_stream is not None:
        return _raw_stream(device)
    return stream


def kv_cache_store(handle, device, stream, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths,
                   layer_idx, kv_idx, dropped):
    p = Pack(7, 1)  # x, input_row_offsets, the cache's four, dropped
    args = (p.tensor(x), p.tensor(input_row_offsets), p.cache(blocks, scales, lookup_table, cache_lengths))
    dropped = p.tensor(dropped)
    check(lib.mlajit_kv_cache_store(handle, *args, layer_idx, kv_idx, dropped, _context(device, stream)))


def kv_cache_gather(handle, device, stream, blocks, scales, lookup_table, cache_lengths, batch_ids, positions,
                    layer_idx, kv_idx, y, dropped):
    p = Pack(8, 1)
    args = (p.cache(blocks, scales, lookup_table, cache_lengths), p.tensor(batch_ids), p.tensor(positions))
    outs = (p.tensor(y), p.tensor(dropped))
    check(lib.mlajit_kv_cache_gather(handle, *args, layer_idx, kv_idx, *outs, _context(device, stream)))


def sparse_index_remap(handle, device, stream, indices, input_row_offsets, lookup_table, num_blocks, out):
    p = Pack(4)
    args = (p.tensor(indices), p.tensor(input_row_offsets), p.tensor(lookup_table))
    out = p.tensor(out)
    check(lib.mlajit_sparse_index_remap(handle, *args, num_blocks, out, _context(device, stream)))


def mla_indexer(handle, device, stream, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table,
                k_cache_lengths, layer_idx, max_keys_per_seq, out, workspace):
    p = Pack(9, 1)
    args = (p.tensor(q), p.tensor(qs), p.tensor(input_row_offsets),
            p.cache(k_blocks, k_scales, k_lookup_table, k_cache_lengths))
    outs = (p.tensor(out), p.tensor(workspace))
    check(lib.mlajit_mla_indexer(handle, *args, layer_idx, max_keys_per_seq, *outs, _context(device, stream)))


def sparse_prefill(handle, device, stream, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale,
                   attn_sink, out, lse, workspace):
    p = Pack(9, 1)
    args = (p.tensor(q), p.cache(kv_blocks, kv_scales), p.tensor(indices, True), p.tensor(topk_lengths))
    outs = (p.tensor(attn_sink), p.tensor(out), p.tensor(lse), p.tensor(workspace))
    check(lib.mlajit_sparse_prefill_ws(handle, *args, layer_idx, softmax_scale, *outs, _context(device, stream)))
