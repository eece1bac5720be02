"""The eager launch paths without a GPU: the C extension mlajit._fastcall and its ctypes fallback
(_launch_ctypes) hand the C API the same argument structs (the entry points are replaced by
recorders), make the device current once per change and thread, resolve the stream the same way,
and raise the same errors, the library's own included. Torch tensors (the extension's attribute
path) need torch; objects with __cuda_array_interface__ (its fallback path) do not."""
import ctypes
import threading

import pytest

import mlajit
from mlajit import _launch, _launch_ctypes, _lib

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed: torch-tensor launch tests skipped")

if _launch._fastcall is None:
    pytest.skip("mlajit._fastcall not built (no Python headers at install): the ctypes path alone is in use",
                allow_module_level=True)

IMPLS = {"fastcall": _launch._fastcall, "ctypes": _launch_ctypes}
REMAP = mlajit.Op({"op": "sparse_index_remap", "params": {"page_size": 64}})
STREAM = 0x1234

# Each entry point's arguments after the handle: t tensor, c paged cache, v a plain value, s stream.
LAYOUTS = {
    "mlajit_kv_cache_store": "ttcvvts",
    "mlajit_kv_cache_gather": "cttvvtts",
    "mlajit_sparse_index_remap": "tttvts",
    "mlajit_mla_indexer": "tttcvvtts",
    "mlajit_sparse_prefill_ws": "tcttvftttts",
}


def _tensor_struct(address):
    if not address:
        return None
    raw = ctypes.string_at(address, 112)
    data, dtype, ndim = ctypes.c_uint64.from_buffer_copy(raw, 0).value, raw[8], raw[12]
    dims = [ctypes.c_int64.from_buffer_copy(raw, 16 + 8 * i).value for i in range(12)]
    return {"data": data, "dtype": dtype, "ndim": ndim, "shape": dims[:6], "strides": dims[6:]}


def _cache_struct(address):
    pointers = [ctypes.c_uint64.from_buffer_copy(ctypes.string_at(address, 32), 8 * i).value for i in range(4)]
    return [_tensor_struct(p) for p in pointers]


@pytest.fixture
def recorded():
    """Replaces the device entry points with recorders; yields the list of (name, decoded args)."""
    calls = []
    keep = []
    addresses = {}
    for name in _lib.DEVICE_FUNCTIONS:
        f = getattr(_lib.lib, name)
        layout = LAYOUTS.get(name)

        def record(*args, name=name, layout=layout):
            if layout is None:  # mlajit_set_device(ordinal)
                calls.append((name, args))
                return 0
            decoded = [args[0]]
            for kind, value in zip(layout, args[1:]):
                if kind == "t":
                    decoded.append(_tensor_struct(value))
                elif kind == "c":
                    decoded.append(_cache_struct(value))
                elif kind == "f":
                    decoded.append(round(value, 6))
                else:
                    decoded.append(value)
            calls.append((name, decoded))
            return 0

        thunk = ctypes.CFUNCTYPE(f.restype, *f.argtypes)(record)
        keep.append(thunk)
        addresses[name] = ctypes.cast(thunk, ctypes.c_void_p).value
    original = _lib.device_function_addresses()
    _launch.replace_device_functions(addresses)
    try:
        yield calls
    finally:
        _launch.replace_device_functions(original)


class ArrayInterface:
    """A non-torch array (as CuPy or Numba would pass): only __cuda_array_interface__."""

    def __init__(self, data, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"data": (data, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def _calls_of_every_op():  # needs torch
    """One call per op with CPU tensors (device -1: nothing is made current), optional tensors
    given and absent, a transposed view, an array-interface object and the i32 indices that
    sparse_prefill reads as u32."""
    u32, i32, bf16, f32, fp8 = torch.uint32, torch.int32, torch.bfloat16, torch.float32, torch.float8_e4m3fn
    x = torch.zeros(5, 1, 576, dtype=bf16)
    offs, lut, lens = torch.zeros(3, dtype=u32), torch.zeros(2, 4, dtype=u32), torch.zeros(2, dtype=u32)
    blocks, scales = torch.zeros(8, 1, 2, 64, 1, 656, dtype=fp8), torch.zeros(8, 1, 2, 64, 1, 9, dtype=f32)
    dropped = torch.zeros(1, dtype=u32)
    idx = torch.zeros(64, 5, dtype=i32).t()  # strides (1, 5)
    cai = ArrayInterface(0xABC000, (5,), "<u4")
    h = REMAP.handle
    return [
        ("kv_cache_store", (h, -1, STREAM, x, offs, blocks, scales, lut, lens, 1, 0, dropped)),
        ("kv_cache_store", (h, -1, STREAM, x, offs, blocks, None, lut, lens, 0, 1, None)),
        ("kv_cache_gather", (h, -1, STREAM, blocks, scales, lut, None, cai, cai, 1, 0, x, dropped)),
        ("sparse_index_remap", (h, -1, STREAM, idx, offs, lut, 1 << 40, idx)),
        ("mla_indexer", (h, -1, STREAM, x, offs, offs, blocks, scales, lut, lens, 1, 8192, idx, None)),
        ("sparse_prefill", (h, -1, STREAM, x, blocks, None, idx, lens, 1, 0.125, None, x, offs, None)),
        ("sparse_prefill", (h, -1, None, x, blocks, scales, torch.zeros(5, 64, dtype=u32), lens, 0, 1.0, lens, x, None,
                            offs)),
    ]


@needs_torch
def test_both_paths_pass_the_same_structs(recorded):
    calls = _calls_of_every_op()
    for op, args in calls:
        for impl in IMPLS.values():
            getattr(impl, op)(*args)
        (name_a, fast), (name_b, slow) = recorded[-2:]
        assert name_a == name_b == "mlajit_" + op + ("_ws" if op == "sparse_prefill" else "")
        assert fast == slow, op
    store = recorded[0][1]
    x = calls[0][1][3]
    assert store[0] == REMAP.handle and store[-1] == STREAM
    assert store[1] == {"data": x.data_ptr(), "dtype": 2, "ndim": 3, "shape": [5, 1, 576, 0, 0, 0],
                        "strides": [576, 576, 1, 0, 0, 0]}
    assert store[3][1]["dtype"] == 0 and store[3][3]["shape"][:1] == [2]  # scales f32, cache_lengths
    remap = [args for name, args in recorded if name == "mlajit_sparse_index_remap"][0]
    assert remap[1]["strides"][:2] == [1, 5] and remap[4] == 1 << 40
    gather = [args for name, args in recorded if name == "mlajit_kv_cache_gather"][0]
    assert gather[2] == {"data": 0xABC000, "dtype": 4, "ndim": 1, "shape": [5, 0, 0, 0, 0, 0], "strides": [0] * 6}
    prefill = [args for name, args in recorded if name == "mlajit_sparse_prefill_ws"][::2]  # fastcall's
    assert prefill[0][3]["dtype"] == 4  # i32 indices read as u32
    assert prefill[0][2][1] is None and prefill[1][2][1]["dtype"] == 0  # kv_scales absent, then f32
    assert prefill[1][-1] is None  # no stream and no device: the legacy default stream
    assert prefill[0][-2] is None and prefill[1][-2]["data"] == calls[-1][1][-1].data_ptr()  # the workspace


def test_both_paths_pass_the_same_structs_for_array_interface_objects(recorded):
    h, dev, _, t, offs, lut, nb, _ = _remap_args(-1)
    strided = ArrayInterface(0x40000, (5, 64), "<i4", strides=(4, 20))  # a transposed view, in bytes
    for impl in IMPLS.values():
        impl.sparse_index_remap(h, dev, None, t, offs, lut, nb, strided)
    (_, fast), (_, slow) = recorded
    assert fast == slow
    assert fast[1] == {"data": 0x10000, "dtype": 5, "ndim": 2, "shape": [5, 64, 0, 0, 0, 0], "strides": [0] * 6}
    assert fast[5]["strides"] == [1, 5, 0, 0, 0, 0] and fast[-1] is None


def test_device_is_made_current_once_per_change_and_thread(recorded):
    for impl in IMPLS.values():
        for device in (0, 0, 1, 1, 0):
            impl.sparse_index_remap(*_remap_args(device))
        other_thread = threading.Thread(target=impl.sparse_index_remap, args=_remap_args(0))
        other_thread.start()
        other_thread.join()
        devices = [args[0] for name, args in recorded if name == "mlajit_set_device"]
        recorded.clear()
        assert devices == [0, 1, 0, 0], impl


def _remap_args(device, typestr="<i4"):
    """sparse_index_remap's launch arguments as array-interface objects (no torch needed)."""
    t = ArrayInterface(0x10000, (5, 64), typestr)
    return (REMAP.handle, device, STREAM, t, ArrayInterface(0x20000, (3,), "<u4"),
            ArrayInterface(0x30000, (2, 4), "<u4"), 24, t)


@needs_torch
@pytest.mark.parametrize("impl", list(IMPLS))
def test_unusable_tensors_are_refused_with_the_same_message(impl, recorded):
    launch = IMPLS[impl].sparse_index_remap
    h, dev, stream, _, offs, lut, nb, out = _remap_args(-1)
    t = torch.zeros(5, 64, dtype=torch.int32)
    with pytest.raises(TypeError, match="torch.float64 is not an mlajit dtype"):
        launch(h, dev, stream, t.double(), offs, lut, nb, out)
    with pytest.raises(ValueError, match="strides are all 0"):
        launch(h, dev, stream, torch.zeros(1, 1, dtype=torch.int32).expand(5, 64), offs, lut, nb, out)
    with pytest.raises(ValueError, match="at most 6"):
        launch(h, dev, stream, torch.zeros((1,) * 7, dtype=torch.int32), offs, lut, nb, out)
    assert not recorded  # nothing reached the C API


@pytest.mark.parametrize("impl", list(IMPLS))
def test_non_tensors_are_refused_with_the_same_message(impl, recorded):
    h, dev, stream, t, offs, lut, nb, out = _remap_args(-1)
    with pytest.raises(TypeError, match="str is not a tensor"):
        IMPLS[impl].sparse_index_remap(h, dev, stream, "indices", offs, lut, nb, out)
    with pytest.raises(TypeError, match="typestr '<f8' is not an mlajit dtype"):
        IMPLS[impl].sparse_index_remap(h, dev, stream, ArrayInterface(0x10000, (5,), "<f8"), offs, lut, nb, out)
    assert not recorded


@pytest.mark.parametrize("impl", list(IMPLS))
def test_library_errors_carry_the_cpp_message(impl):
    """The real entry point validates before touching a device: the message is the library's."""
    h, dev, stream, t, offs, lut, nb, out = _remap_args(-1, typestr="<u4")
    with pytest.raises(mlajit.InvalidArgumentError, match="indices dtype: got u32, expected i32"):
        IMPLS[impl].sparse_index_remap(h, dev, stream, t, offs, lut, nb, out)


def test_the_eager_path_uses_the_extension():
    assert _launch.impl is _launch._fastcall
    assert mlajit.ops._launch is _launch._fastcall


DS_STORE = {"op": "kv_cache_store", "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576, "page_size": 64,
                                               "is_mla": True, "num_layers": 2, "quantization_granularity": 128,
                                               "scale_fmt": "ue8m0", "layout": "fp8_ds_mla", "input_dtype": "f32"}}


def test_fp8_ds_mla_params_are_checked_when_the_op_is_made():
    for key, value, message in (("scale_fmt", "fp32", "params.scale_fmt: got fp32, expected ue8m0"),
                                ("quantization_granularity", 64, "params.quantization_granularity: got 64"),
                                ("head_size", 512, "params.head_size: got 512, expected 576"),
                                ("dtype", "bf16", "params.dtype: got bf16, expected fp8_e4m3"),
                                ("layout", "ds_mla", "params.layout: got \"ds_mla\", expected split | fp8_ds_mla")):
        spec = {"op": "kv_cache_store", "params": dict(DS_STORE["params"], **{key: value})}
        with pytest.raises(mlajit.InvalidArgumentError, match=message.replace("|", r"\|")):
            mlajit.Op(spec)
    assert mlajit.Op(DS_STORE).json  # valid; 0 granularity means the layout's 128 too
    mlajit.Op({"op": "kv_cache_store", "params": dict(DS_STORE["params"], quantization_granularity=0)})


@pytest.mark.parametrize("impl", list(IMPLS))
def test_fp8_ds_mla_views_are_checked_by_the_library(impl):
    """u8 records [num_blocks, 1, num_layers, page_size, 656] (|u1 array-interface objects), no
    scales; the messages are the library's (nothing reaches a device)."""
    h = mlajit.get_op(DS_STORE).handle
    x = ArrayInterface(0x10000, (10, 1, 576), "<f4")
    offs, lut, lens = (ArrayInterface(0x20000, (3,), "<u4"), ArrayInterface(0x30000, (2, 3), "<u4"),
                       ArrayInterface(0x40000, (2,), "<u4"))
    blocks = ArrayInterface(0x50000, (5, 1, 2, 64, 656), "|u1")
    scales = ArrayInterface(0x60000, (5, 1, 2, 64, 1, 5), "<f4")
    store = IMPLS[impl].kv_cache_store
    with pytest.raises(mlajit.InvalidArgumentError, match="cache.scales.*fp8_ds_mla"):
        store(h, -1, STREAM, x, offs, blocks, scales, lut, lens, 0, 0, None)
    with pytest.raises(mlajit.InvalidArgumentError,
                       match=r"cache.blocks dim 4: got u8\[5, 1, 2, 64, 576\], expected size 656"):
        store(h, -1, STREAM, x, offs, ArrayInterface(0x50000, (5, 1, 2, 64, 576), "|u1"), None, lut, lens, 0, 0, None)
    with pytest.raises(mlajit.InvalidArgumentError, match="cache.blocks rank: got 3"):
        store(h, -1, STREAM, x, offs, ArrayInterface(0x50000, (5, 64, 656), "|u1"), None, lut, lens, 0, 0, None)
    with pytest.raises(mlajit.InvalidArgumentError, match="cache.blocks dtype: got f32"):
        store(h, -1, STREAM, x, offs, ArrayInterface(0x50000, (5, 1, 2, 64, 656), "<f4"), None, lut, lens, 0, 0, None)
    with pytest.raises(mlajit.InvalidArgumentError, match="layer_idx"):  # the views pass; the layer does not
        store(h, -1, STREAM, x, offs, blocks, None, lut, lens, 2, 0, None)
    one_layer = mlajit.get_op({"op": "kv_cache_store", "params": dict(DS_STORE["params"], num_layers=1)}).handle
    with pytest.raises(mlajit.InvalidArgumentError, match="layer_idx"):  # [num_blocks, page_size, 656] is taken
        store(one_layer, -1, STREAM, x, offs, ArrayInterface(0x50000, (5, 64, 656), "|u1"), None, lut, lens, 1, 0,
              None)


@needs_torch
def test_uint8_torch_tensors_are_u8():
    from mlajit import _tensor
    assert _tensor.fields(torch.zeros(2, 656, dtype=torch.uint8))[1] == _tensor.U8 == 6
