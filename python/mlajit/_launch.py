"""The eager launch functions of the five ops, one implementation for the process:
mlajit._fastcall (C, built with the package) or, without it, _launch_ctypes (the same functions
through ctypes). Both take (handle, device, stream, <the C API's arguments>): device >= 0 is made
current for the calling thread (once per change) and, with stream None, the launch goes to torch's
current stream of that device; device -1 with stream None uses the legacy default stream.

Both call the libmlajit.so that _lib loaded (the C extension gets its function addresses), so a
process holds one library whatever MLAJIT_LIBRARY says.
"""
import threading

from . import _launch_ctypes, _lib, _tensor

try:
    from . import _fastcall
except ImportError:  # built without Python development headers: the ctypes path serves
    _fastcall = None

torch = _tensor.torch


def _torch_raw_stream():
    if torch is None:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def _bind():
    """Points both implementations at the current entry points of _lib.lib (see _lib.DEVICE_FUNCTIONS)."""
    raw_stream = _torch_raw_stream()
    _launch_ctypes._raw_stream = raw_stream
    _launch_ctypes._thread = threading.local()  # the entry points may be another library's now
    if _fastcall is None:
        return
    addresses = _lib.device_function_addresses()
    dtypes = tuple(_tensor.TORCH_OF.get(code) for code in range(_tensor.NUM_DTYPES))
    _fastcall.bind(addresses, _tensor._Tensor, dtypes, _tensor.fields, raw_stream, _lib.raise_for)


_bind()
impl = _fastcall if _fastcall is not None else _launch_ctypes


def replace_device_functions(addresses):
    """Both launch paths call the C functions at `addresses` ({name in _lib.DEVICE_FUNCTIONS:
    address}) instead of libmlajit's: scripts/python_overhead.py --dry times the Python side with
    a no-op, the tests record the argument structs. _lib.device_function_addresses() taken before
    gives the addresses that undo it."""
    _lib.replace_device_functions(addresses)
    _bind()
