"""The C API's view of a tensor: fields(obj) -> (data, dtype code, ndim, shape[6], strides[6]),
and Pack, which packs a call's mlajit_tensor / mlajit_paged_cache structs into one ctypes buffer
(the ctypes launch path, _launch_ctypes.py). The C extension reads torch tensors itself and calls
fields() for everything else, so both paths accept the same objects with the same errors:
torch.Tensor, any object with __cuda_array_interface__ (v2/v3), or with __dlpack__ (through torch).
"""
import ctypes
import struct

# mlajit_tensor: void* data; int32 dtype; int32 ndim; int64 shape[6]; int64 strides[6] (112 bytes).
TENSOR = struct.Struct("<Qii6q6q")
# mlajit_paged_cache: four const mlajit_tensor* (blocks, scales, lookup_table, cache_lengths).
CACHE = struct.Struct("<4Q")
MAX_DIMS = 6

F32, F16, BF16, FP8_E4M3, U32, I32, U8 = range(7)
NUM_DTYPES = 7
DTYPE_NAMES = {"f32": F32, "f16": F16, "bf16": BF16, "fp8_e4m3": FP8_E4M3, "u32": U32, "i32": I32, "u8": U8}

try:
    import torch

    _TORCH_DTYPES = {
        torch.float32: F32,
        torch.float16: F16,
        torch.bfloat16: BF16,
        torch.float8_e4m3fn: FP8_E4M3,
        torch.uint32: U32,
        torch.int32: I32,
        torch.uint8: U8,  # the records of a layout "fp8_ds_mla" cache
    }
    TORCH_OF = {v: k for k, v in _TORCH_DTYPES.items()}
    _Tensor = torch.Tensor
except ImportError:  # the package works without torch (precompile, info, __cuda_array_interface__)
    torch = None
    _TORCH_DTYPES = {}
    TORCH_OF = {}
    _Tensor = None

_CAI_DTYPES = {"<f4": F32, "<f2": F16, "<u4": U32, "<i4": I32, "|u1": U8}


_PAD = [(0,) * (MAX_DIMS - n) for n in range(MAX_DIMS + 1)]


def _torch_fields(t):
    code = _TORCH_DTYPES.get(t.dtype)
    if code is None:
        raise TypeError(f"tensor dtype {t.dtype} is not an mlajit dtype (f32, f16, bf16, float8_e4m3fn, uint32, int32, "
                        "uint8)")
    shape = t.shape
    nd = len(shape)
    if nd > MAX_DIMS:
        raise ValueError(f"tensor of {nd} dims: mlajit tensors have at most {MAX_DIMS}")
    strides = t.stride()
    if nd and not any(strides) and t.numel() > 1:
        # All-zero strides mean "contiguous" in the C API; a broadcast view must be materialized.
        raise ValueError("a tensor whose strides are all 0 (a broadcast view) cannot be passed; call .contiguous()")
    pad = _PAD[nd]
    return t.data_ptr(), code, nd, (*shape, *pad), (*strides, *pad)


def _cai_fields(obj):
    cai = obj.__cuda_array_interface__
    code = _CAI_DTYPES.get(cai["typestr"])
    if code is None:
        raise TypeError(f"__cuda_array_interface__ typestr {cai['typestr']!r} is not an mlajit dtype "
                        "(f32 <f4, f16 <f2, u32 <u4, i32 <i4, u8 |u1; bf16/fp8 need torch tensors)")
    shape = tuple(cai["shape"])
    nd = len(shape)
    item = int(cai["typestr"][2:])
    strides = cai.get("strides")
    strides = (0,) * nd if strides is None else tuple(s // item for s in strides)
    return cai["data"][0], code, nd, shape + (0,) * (MAX_DIMS - nd), strides + (0,) * (MAX_DIMS - nd)


def fields(t):
    if type(t) is _Tensor or (torch is not None and isinstance(t, torch.Tensor)):
        return _torch_fields(t)
    if hasattr(t, "__cuda_array_interface__"):
        return _cai_fields(t)
    if torch is not None and hasattr(t, "__dlpack__"):
        return _torch_fields(torch.from_dlpack(t))
    raise TypeError(f"{type(t).__name__} is not a tensor (torch.Tensor, __cuda_array_interface__ or __dlpack__)")


class Pack:
    """One call's argument structs in one buffer; tensor()/cache() return their addresses."""

    __slots__ = ("buf", "base", "off")

    def __init__(self, n_tensors, n_caches=0):
        self.buf = ctypes.create_string_buffer(n_tensors * TENSOR.size + n_caches * CACHE.size)
        self.base = ctypes.addressof(self.buf)
        self.off = 0

    def tensor(self, t, i32_as_u32=False):
        if t is None:
            return None
        data, code, nd, shape, strides = fields(t)
        if i32_as_u32 and code == I32:
            code = U32  # the indexer's i32 output read as the prefill's u32 encoded indices (same bits)
        off = self.off
        TENSOR.pack_into(self.buf, off, data, code, nd, *shape, *strides)
        self.off = off + TENSOR.size
        return self.base + off

    def cache(self, blocks, scales=None, lookup_table=None, cache_lengths=None):
        ptrs = (self.tensor(blocks) or 0, self.tensor(scales) or 0, self.tensor(lookup_table) or 0,
                self.tensor(cache_lengths) or 0)
        off = self.off
        CACHE.pack_into(self.buf, off, *ptrs)
        self.off = off + CACHE.size
        return self.base + off
