"""Loads libmlajit.so and declares the C API (include/mlajit/c_api.h) for ctypes.

The library is the one installed inside this package; MLAJIT_LIBRARY=/path/libmlajit.so overrides
it (a development build). Every failing call raises the exception class of its status with the
library's own message (mlajit_last_error), so Python sees exactly the C++ validation text.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


class MlajitError(RuntimeError):
    """An mlajit call failed; the message is the library's (what, value, expected)."""

    status = 6


class InvalidArgumentError(MlajitError, ValueError):
    status = 1


class CompileError(MlajitError):
    status = 2


class DriverError(MlajitError):
    status = 3


class CacheError(MlajitError):
    status = 4


class IOError_(MlajitError, OSError):
    status = 5


_ERRORS = {c.status: c for c in (InvalidArgumentError, CompileError, DriverError, CacheError, IOError_)}


class RuntimeOptions(ctypes.Structure):
    """mlajit_runtime_options of c_api.h."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("cache_path", ctypes.c_char_p),
                ("disable_disk_cache", ctypes.c_int), ("cache_max_bytes", ctypes.c_uint64)]


def _path():
    override = os.environ.get("MLAJIT_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "libmlajit.so")


def _load():
    path = _path()
    if not os.path.exists(path):
        raise ImportError(
            f"libmlajit.so not found at {path}: install the package with `pip install ./python` "
            "(which builds it) or set MLAJIT_LIBRARY to a built libmlajit.so")
    lib = ctypes.CDLL(path)
    P, I, I64, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_char_p
    sigs = {
        "mlajit_version": (S, []),
        "mlajit_last_error": (S, []),
        "mlajit_info_json": (S, []),
        "mlajit_set_device": (I, [I]),
        "mlajit_set_log_callback": (I, [P, P, I]),
        "mlajit_op_create": (I, [S, ctypes.POINTER(P)]),
        "mlajit_op_destroy": (None, [P]),
        "mlajit_op_load": (I, [P]),
        "mlajit_op_describe": (S, [P]),
        "mlajit_precompile": (I, [S, S, ctypes.POINTER(I)]),
        "mlajit_runtime_create_with_options": (I, [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(P)]),
        "mlajit_runtime_destroy": (None, [P]),
        "mlajit_runtime_cache_dir": (S, [P]),
        "mlajit_op_create_in": (I, [P, S, ctypes.POINTER(P)]),
        "mlajit_runtime_precompile": (I, [P, S, S, ctypes.POINTER(I)]),
        # Tensor arguments are passed as addresses of packed mlajit_tensor / mlajit_paged_cache
        # structs (see _tensor.py), hence plain void pointers.
        "mlajit_kv_cache_store": (I, [P, P, P, P, I, I, P, P]),
        "mlajit_kv_cache_gather": (I, [P, P, P, P, I, I, P, P, P]),
        "mlajit_sparse_index_remap": (I, [P, P, P, P, I64, P, P]),
        "mlajit_mla_indexer_workspace_bytes": (I, [P, I64, I64, ctypes.POINTER(ctypes.c_size_t)]),
        "mlajit_mla_indexer": (I, [P, P, P, P, P, I, I64, P, P, P]),
        "mlajit_sparse_prefill": (I, [P, P, P, P, P, I, ctypes.c_float, P, P, P, P]),
        "mlajit_sparse_prefill_workspace_bytes": (I, [P, I64, ctypes.POINTER(ctypes.c_size_t)]),
        "mlajit_sparse_prefill_ws": (I, [P, P, P, P, P, I, ctypes.c_float, P, P, P, P, P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


lib = _load()


def raise_for(status):
    """Raises the exception of a nonzero mlajit_status with the thread's last error."""
    msg = lib.mlajit_last_error().decode("utf-8", "replace")
    raise _ERRORS.get(status, MlajitError)(msg)


def check(status):
    if status:
        raise_for(status)


# The entry points that need a GPU: what a dry timing run replaces.
DEVICE_FUNCTIONS = ("mlajit_set_device", "mlajit_kv_cache_store", "mlajit_kv_cache_gather", "mlajit_sparse_index_remap",
                    "mlajit_mla_indexer", "mlajit_sparse_prefill_ws")


def device_function_addresses():
    """{name: address} of the entry points of DEVICE_FUNCTIONS that `lib` calls now."""
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in DEVICE_FUNCTIONS}


def replace_device_functions(addresses):
    """The entry points of DEVICE_FUNCTIONS named in `addresses` ({name: address of a C function
    of the same signature}) call that function instead: for timing the Python side without a GPU
    and for tests (use _launch.replace_device_functions, which rebinds the C extension too)."""
    for name, address in addresses.items():
        f = getattr(lib, name)
        setattr(lib, name, ctypes.CFUNCTYPE(f.restype, *f.argtypes)(address))
