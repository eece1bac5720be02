#!/usr/bin/env python3
"""Host time per op call from Python against the raw C API, in one process.

Times one sparse_index_remap launch three ways, interleaved round by round so that load on the
host hits all three alike, and prints the median per-call time of each:
  (a) c_api      the C function through ctypes with argument structs built once (the floor),
  (b) mlajit.ops mlajit.ops.sparse_index_remap(spec, ...) on torch tensors (the user's call),
  (c) torch.ops  torch.ops.mlajit.sparse_index_remap(spec_json, ...) (the custom op that
                 torch.compile graphs call; it allocates its output, as a functional op must).
"added" is (b) - (a) and (c) - (a): what the Python layer costs per call.

On a GPU (the default when torch sees one) every call launches the real kernel on torch's current
stream. --dry measures the Python side alone on a machine without a GPU: the library's launch
functions are replaced by a C function that returns 0 (built here with cc), the tensors are CPU
tensors that torch.Tensor.is_cuda / get_device report as device 0, and the raw-stream query
returns 0. Those stand-ins cost a little more than torch's own (Python-level overrides), so a dry
figure slightly overstates (b) and (c).

Usage: python scripts/python_overhead.py [--dry] [--calls N] [--rounds R]
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

def build_noop():
    """A C function of any of the launch signatures that does nothing and returns MLAJIT_OK."""
    d = tempfile.mkdtemp(prefix="mlajit-noop-")
    src, so = os.path.join(d, "noop.c"), os.path.join(d, "libnoop.so")
    with open(src, "w") as f:
        f.write("int mlajit_noop_launch(void) { return 0; }\n")  # extra register args are ignored (SysV)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    return ctypes.cast(ctypes.CDLL(so).mlajit_noop_launch, ctypes.c_void_p).value


def fake_cuda(torch):
    """CPU tensors that the eager path takes for tensors of device 0 (dry runs only)."""
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.Tensor.get_device = lambda self: 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0


def measure(dry=False, calls=2000, rounds=15):
    """{"c_api" | "mlajit.ops" | "torch.ops": median us per call} and a line saying where."""
    import torch

    dry = dry or not torch.cuda.is_available()
    if dry:
        fake_cuda(torch)
    import mlajit
    from mlajit import _launch, _lib

    if dry:
        noop = build_noop()
        _launch.replace_device_functions({name: noop for name in _lib.DEVICE_FUNCTIONS})
    dev = "cpu" if dry else "cuda"
    spec = {"op": "sparse_index_remap", "params": {"page_size": 64}}
    T, K, NB = 187, 64, 24
    logical = torch.zeros(T, K, dtype=torch.int32, device=dev)
    offs = torch.tensor([0, 37, T], dtype=torch.int64).to(torch.uint32).to(dev)
    lut = torch.arange(2 * 4, dtype=torch.int64).reshape(2, 4).to(torch.uint32).to(dev)
    out = torch.empty_like(logical)

    # (a) the C API with structs made once (mlajit_tensor as ctypes.Structure, independent of mlajit).
    class CTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("shape", ctypes.c_int64 * 6), ("strides", ctypes.c_int64 * 6)]

    codes = {torch.int32: 5, torch.uint32: 4}
    keep = [CTensor(t.data_ptr(), codes[t.dtype], t.dim(), (ctypes.c_int64 * 6)(*t.shape), (ctypes.c_int64 * 6)())
            for t in (logical, offs, lut, out)]
    ptrs = [ctypes.addressof(c) for c in keep]
    handle = mlajit.get_op(spec).handle
    raw = _lib.lib.mlajit_sparse_index_remap
    stream = 0 if dry else torch.cuda.current_stream().cuda_stream
    spec_json = mlajit.get_op(spec).json
    py = mlajit.ops.sparse_index_remap
    custom = torch.ops.mlajit.sparse_index_remap

    def c_api():
        raw(handle, ptrs[0], ptrs[1], ptrs[2], NB, ptrs[3], stream)

    def ops_call():
        py(spec, logical, offs, lut, NB, out=out)

    def torch_ops_call():
        custom(spec_json, logical, offs, lut, NB)

    paths = [("c_api", c_api), ("mlajit.ops", ops_call), ("torch.ops", torch_ops_call)]
    sync = (lambda: None) if dry else torch.cuda.synchronize
    for _, fn in paths:  # warm up: loads the kernel, fills caches
        for _ in range(200):
            fn()
    sync()
    per_call = {name: [] for name, _ in paths}
    for _ in range(rounds):
        for name, fn in paths:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call[name].append((time.perf_counter() - t0) / calls * 1e6)
            sync()  # keeps the launch queue from filling up (a full queue blocks the host)
    med = {name: statistics.median(v) for name, v in per_call.items()}
    where = ("dry: no-op C launch, CPU tensors" if dry else f"GPU: {torch.cuda.get_device_name()}")
    where += f"; launch path {_launch.impl.__name__}"
    return med, (f"host overhead: time per sparse_index_remap call, median of {rounds} rounds x {calls} calls ({where}; "
                 f"torch {torch.__version__}, Python {sys.version.split()[0]})")


def report(med, where):
    lines = [where]
    for name in ("c_api", "mlajit.ops", "torch.ops"):
        added = "" if name == "c_api" else f", added {med[name] - med['c_api']:5.2f} us"
        lines.append(f"  {name:<11} {med[name]:6.2f} us per call{added}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry", action="store_true", help="no GPU: time the Python side with a no-op C launch")
    ap.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds per path; the median is printed (default 15)")
    a = ap.parse_args()
    print(report(*measure(a.dry, a.calls, a.rounds)))


if __name__ == "__main__":
    main()
