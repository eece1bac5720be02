"""Ops as handles (Op), ahead-of-time compilation (precompile) and process facts (info)."""
import concurrent.futures
import copy
import ctypes
import json
import os
import sys
import time

from ._lib import InvalidArgumentError, RuntimeOptions, check, lib


class Op:
    """An op specialized on its params: Op({"op": "sparse_prefill", "params": {...}}).

    Creation validates the spec (the library's checks). load() compiles or loads the kernel of this
    exact spec for the current device now. Launches resolve knobs left open (threads 0, ...) per
    shape bucket, so before CUDA graph capture run one eager call per shape unless every knob is
    explicit.
    """

    def __init__(self, spec, runtime=None):
        text = spec if isinstance(spec, str) else json.dumps(spec)
        h = ctypes.c_void_p()
        if runtime is None:
            check(lib.mlajit_op_create(text.encode(), ctypes.byref(h)))
        else:
            check(lib.mlajit_op_create_in(runtime.handle, text.encode(), ctypes.byref(h)))
        self.runtime = runtime
        self.handle = h.value
        self.json = lib.mlajit_op_describe(self.handle).decode()
        d = json.loads(self.json)
        self.op, self.params = d["op"], d["params"]
        self.workspace_bytes = {}  # mla_indexer: (total_tokens, max_keys_per_seq) -> bytes (ops.py)

    def load(self):
        check(lib.mlajit_op_load(self.handle))
        return self

    def describe(self):
        return {"op": self.op, "params": dict(self.params)}

    def __repr__(self):
        return f"mlajit.Op({self.json})"

    def __del__(self):
        h, self.handle = getattr(self, "handle", None), None
        if h and lib is not None:
            lib.mlajit_op_destroy(h)


class Runtime:
    """A runtime with cache directories of its own instead of the environment's (which the
    process-wide runtime reads once, at its first use):

        rt = mlajit.Runtime(cache_path="/opt/mlajit/cache:/home/me/.cache/mlajit")
        op = rt.op({"op": "sparse_prefill", "params": {...}})   # pass op to mlajit.ops.*
        rt.precompile(config, arch="sm_90a")

    cache_path: directories separated by ':' in lookup order (MLAJIT_CACHE_PATH's rules: the first
    one you can write takes misses, the others are read-only); None: the environment's.
    disable_disk_cache: compile on every first use. cache_max_bytes: LRU cap of the writable layer.
    The directories are checked now: an unsafe one raises CacheError here.
    """

    def __init__(self, cache_path=None, disable_disk_cache=False, cache_max_bytes=0):
        if cache_path is not None and not isinstance(cache_path, str):
            cache_path = ":".join(os.fspath(p) for p in cache_path)
        self._path = None if cache_path is None else cache_path.encode()  # kept alive for the call
        o = RuntimeOptions(ctypes.sizeof(RuntimeOptions), self._path, int(bool(disable_disk_cache)),
                           int(cache_max_bytes))
        h = ctypes.c_void_p()
        check(lib.mlajit_runtime_create_with_options(ctypes.byref(o), ctypes.byref(h)))
        self.handle = h.value

    @property
    def cache_dir(self):
        """The directory misses are written to, or None (disk cache disabled, every layer read-only)."""
        return lib.mlajit_runtime_cache_dir(self.handle).decode() or None

    def op(self, spec):
        """An Op whose kernels are compiled, cached and loaded through this runtime."""
        return Op(spec, runtime=self)

    def precompile(self, config_or_specs, arch):
        """precompile() into this runtime's disk cache; arch: "sm_90a", "sm_90a,sm_100a" or a list."""
        specs, _ = _specs_of(config_or_specs)
        results = []
        for a in _archs_of(arch):
            for s in specs:
                hit = ctypes.c_int(0)
                check(lib.mlajit_runtime_precompile(self.handle, json.dumps(s).encode(), a.encode(), ctypes.byref(hit)))
                results.append({"op": s["op"], "params": s["params"], "arch": a, "cache_hit": bool(hit.value)})
        return results

    def __del__(self):
        h, self.handle = getattr(self, "handle", None), None
        if h and lib is not None:
            lib.mlajit_runtime_destroy(h)


_ops = {}
# The hot path for dict specs: id(dict) -> (a copy of the dict, its Op). A hit costs one dict
# comparison instead of json.dumps; a mutated or recycled dict compares unequal and is re-keyed.
_by_id = {}


def get_op(spec, kind=None):
    """The Op of `spec` (an Op, a dict or a JSON string), created once per distinct spec."""
    if isinstance(spec, Op):
        op = spec
    elif isinstance(spec, dict) and (hit := _by_id.get(id(spec))) is not None and hit[0] == spec:
        op = hit[1]
    else:
        key = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        op = _ops.get(key)
        if op is None:
            op = Op(spec)
            _ops[key] = op
            _ops.setdefault(op.json, op)
        if isinstance(spec, dict):
            if len(_by_id) > 4096:
                _by_id.clear()
            _by_id[id(spec)] = (copy.deepcopy(spec), op)
    if kind is not None and op.op != kind:
        raise InvalidArgumentError(f"spec.op: got {op.op!r}, expected {kind!r} for mlajit.ops.{kind}")
    return op


_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_LEVELS = ("error", "warn", "info", "debug")
_log_keep = [None]


def set_log_handler(handler, level=None):
    """Routes the library's log lines to handler(level_name, message) instead of stderr; a
    logging.Logger works too (mapped to its error/warning/info/debug). None restores stderr.
    level ("error" | "warn" | "info" | "debug") also sets the level, as MLAJIT_LOG does."""
    lv = -1 if level is None else _LEVELS.index(level)
    if handler is None:
        check(lib.mlajit_set_log_callback(None, None, lv))
        _log_keep[0] = None
        return
    if hasattr(handler, "warning") and hasattr(handler, "debug"):  # a logging.Logger
        logger = handler
        methods = (logger.error, logger.warning, logger.info, logger.debug)
        handler = lambda name, msg: methods[_LEVELS.index(name)]("%s", msg)  # noqa: E731

    def trampoline(lvl, msg, _user):
        try:
            handler(_LEVELS[lvl], msg.decode("utf-8", "replace"))
        except Exception:  # an exception must not unwind into C++
            pass

    fn = _LOG_FN(trampoline)
    check(lib.mlajit_set_log_callback(ctypes.cast(fn, ctypes.c_void_p), None, lv))
    _log_keep[0] = fn  # the C side holds a raw pointer: keep the thunk alive


def info():
    """What this process uses (the object of `mlajit info --json`): version, NVRTC, cache_dir,
    the MLAJIT_* environment, devices."""
    return json.loads(lib.mlajit_info_json().decode())


def version():
    return lib.mlajit_version().decode()


def cache_dir():
    """The disk cache directory misses go to (MLAJIT_CACHE_PATH's writable layer, else
    MLAJIT_CACHE_DIR, else $XDG_CACHE_HOME/mlajit or ~/.cache/mlajit)."""
    i = info()
    if i.get("cache_dir") is None:
        raise InvalidArgumentError(i.get("cache_dir_error", "no cache directory"))
    return i["cache_dir"]


_MAX_CONFIG_BYTES = 16 << 20  # as the library's readers (src/core/input.hpp)


def _read_config_file(path):
    """The text of a config file: a regular file of at most 16 MiB (a FIFO or device is refused
    without blocking on it, a directory is named as one)."""
    import stat

    kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
             stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        else:
            fd = None
    except OSError as e:
        raise InvalidArgumentError(f"config file {path}: got a path that cannot be opened ({e.strerror}), "
                                   "expected a readable regular file") from None
    if fd is not None:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode):
                data = f.read(_MAX_CONFIG_BYTES + 1)
                if len(data) > _MAX_CONFIG_BYTES:
                    raise InvalidArgumentError(f"config file {path}: got more than {_MAX_CONFIG_BYTES} bytes, "
                                               f"expected at most {_MAX_CONFIG_BYTES} bytes")
                return data.decode()
    kind = kinds.get(stat.S_IFMT(st.st_mode), "not a regular file")
    raise InvalidArgumentError(f"config file {path}: got {kind}, expected a regular file")


def _no_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise InvalidArgumentError(f"config: got the key {json.dumps(k)[:200]} twice, expected each key at most "
                                       "once in an object")
        out[k] = v
    return out


def _specs_of(config_or_specs):
    """(specs, config arch) of a config file path / JSON text / dict / list / Op / spec dict."""
    c = config_or_specs
    if isinstance(c, Op):
        return [c.describe()], None
    if isinstance(c, (str, os.PathLike)):
        text = str(c)
        if not text.lstrip().startswith(("{", "[")):
            text = _read_config_file(text)
        try:
            c = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except RecursionError:
            raise InvalidArgumentError("config: got JSON nested too deeply, expected at most 64 levels of "
                                       "nesting") from None
    if isinstance(c, dict) and "kernels" in c:
        return [{"op": k["op"], "params": k.get("params", {})} for k in c["kernels"]], c.get("arch")
    if isinstance(c, dict):
        return [{"op": c["op"], "params": c.get("params", {})}], None
    if isinstance(c, (list, tuple)):
        out = []
        for s in c:
            out.extend(_specs_of(s)[0])
        return out, None
    raise InvalidArgumentError(f"precompile: got {type(c).__name__}, expected a config (path, JSON, dict with "
                               "'kernels'), a spec dict, an Op or a list of them")


def _archs_of(arch):
    """["sm_90a", "sm_100a"] of "sm_90a,sm_100a" or a list."""
    return [a.strip() for a in (arch.split(",") if isinstance(arch, str) else arch) if a.strip()]


def precompile(config_or_specs, arch=None, jobs=None, progress=None):
    """Compiles every kernel of a config (or specs) into the disk cache for `arch` without a GPU.

    arch: "sm_90a", "sm_90a,sm_100a" or a list; None takes the config's "arch", else the current
    device's. jobs: kernels compiled at once (None: every core; the compiles release the GIL).
    progress: a "precompile n/N" line on stderr (None: when stderr is a terminal). Returns
    [{"op", "params", "arch", "cache_hit", "seconds"}] in the config's order ("seconds": the wall
    time of that kernel; the largest is the critical path of a cold start). A process still loads
    each module once (Op.load() or one launch) before CUDA graph capture: loading is a driver call
    too.
    """
    specs, config_arch = _specs_of(config_or_specs)
    arch = arch or config_arch
    if arch is None:
        devices = info().get("devices") or []
        if not devices:
            raise InvalidArgumentError("precompile: arch: got None with no GPU visible, expected e.g. 'sm_90a'")
        arch = devices[0]["arch"]
    todo = [(a, s) for a in _archs_of(arch) for s in specs]
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise InvalidArgumentError(f"precompile: jobs: got {jobs!r}, expected None or an integer >= 1")
    workers = min(jobs or os.cpu_count() or 1, max(len(todo), 1))
    show = sys.stderr.isatty() if progress is None else bool(progress)

    def one(item):
        a, s = item
        hit = ctypes.c_int(0)
        t0 = time.perf_counter()
        check(lib.mlajit_precompile(json.dumps(s).encode(), a.encode(), ctypes.byref(hit)))
        return {"op": s["op"], "params": s["params"], "arch": a, "cache_hit": bool(hit.value),
                "seconds": time.perf_counter() - t0}

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, item) for item in todo]
        for done, _ in enumerate(concurrent.futures.as_completed(futures), 1):
            if show:
                print(f"\rprecompile {done}/{len(todo)}", end="\n" if done == len(todo) else "", file=sys.stderr,
                      flush=True)
        return [f.result() for f in futures]
