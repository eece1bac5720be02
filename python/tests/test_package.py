"""The package without torch or a GPU: loading, info, spec validation, error mapping, precompile."""
import json
import os
import subprocess
import sys

import pytest

import mlajit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INDEX_REMAP = {"op": "sparse_index_remap", "params": {"page_size": 64}}


def test_version_and_info():
    assert mlajit.__version__ == mlajit.version() and mlajit.__version__.count(".") == 2
    i = mlajit.info()
    assert i["mlajit_version"] == mlajit.__version__
    assert i["cache_dir"] == os.environ["MLAJIT_CACHE_DIR"] == mlajit.cache_dir()
    assert i["env"]["MLAJIT_CACHE_DIR"] == os.environ["MLAJIT_CACHE_DIR"]
    assert isinstance(i["devices"], list)


def test_op_describe_is_canonical_json():
    op = mlajit.Op(INDEX_REMAP)
    d = json.loads(op.json)
    assert d["op"] == "sparse_index_remap" and d["params"]["page_size"] == 64
    assert "threads" in d["params"]  # every param, defaults included
    assert mlajit.Op(json.dumps(INDEX_REMAP)).json == op.json
    assert mlajit.get_op(INDEX_REMAP) is mlajit.get_op(json.dumps(INDEX_REMAP, sort_keys=True))


def test_invalid_spec_raises_the_library_message():
    with pytest.raises(mlajit.InvalidArgumentError, match=r"page_size: got 48, expected a power of two"):
        mlajit.Op({"op": "sparse_index_remap", "params": {"page_size": 48}})
    with pytest.raises(mlajit.InvalidArgumentError, match=r"spec.op: got \"nope\""):
        mlajit.Op('{"op": "nope"}')
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        mlajit.Op("not json")
    with pytest.raises(mlajit.InvalidArgumentError, match="expected 'mla_indexer'"):
        mlajit.ops.mla_indexer(INDEX_REMAP, None, None, None, None, None, None, None, max_keys_per_seq=1)


def test_precompile_rejects_bad_arch_and_writes_nothing(tmp_path):
    with pytest.raises(mlajit.InvalidArgumentError, match="sm_12"):
        mlajit.precompile(INDEX_REMAP, arch="sm_12")


def test_renamed_param_names_its_replacement():
    with pytest.raises(mlajit.InvalidArgumentError, match=r'"scale_block_size" is now "quantization_granularity"'):
        mlajit.Op({"op": "sparse_prefill", "params": {"kv_dtype": "fp8_e4m3", "scale_block_size": 576}})


FP8_MATH = {"op": "sparse_prefill", "params": {"kv_dtype": "fp8_e4m3", "quantization_granularity": 576, "qk_math": "fp8"}}


def test_sparse_prefill_qk_math_passes_through_and_is_validated():
    assert mlajit.Op({"op": "sparse_prefill", "params": {}}).params["qk_math"] == "bf16"  # the default, written out
    op = mlajit.Op(FP8_MATH)
    assert op.params["qk_math"] == "fp8" and op.params["quantization_granularity"] == 576
    assert mlajit.Op(op.json).json == op.json
    with pytest.raises(mlajit.InvalidArgumentError, match=r"kv_dtype: got bf16, expected fp8_e4m3 with qk_math fp8"):
        mlajit.Op({"op": "sparse_prefill", "params": {"qk_math": "fp8"}})
    with pytest.raises(mlajit.InvalidArgumentError, match=r"group scales are not supported in FP8 math"):
        mlajit.Op({"op": "sparse_prefill", "params": {"kv_dtype": "fp8_e4m3", "quantization_granularity": 64, "qk_math": "fp8"}})
    with pytest.raises(mlajit.InvalidArgumentError, match=r"qk_math: got \"fp16\", expected bf16 \| fp8"):
        mlajit.Op({"op": "sparse_prefill", "params": {"qk_math": "fp16"}})


def test_sparse_prefill_scale_fmt_passes_through_and_is_validated():
    assert mlajit.Op({"op": "sparse_prefill", "params": {}}).params["scale_fmt"] == "fp32"  # the default, written out
    op = mlajit.Op({"op": "sparse_prefill",
                    "params": {"kv_dtype": "fp8_e4m3", "quantization_granularity": 64, "scale_fmt": "ue8m0"}})
    assert op.params["scale_fmt"] == "ue8m0" and op.params["quantization_granularity"] == 64
    assert mlajit.Op(op.json).json == op.json
    with pytest.raises(mlajit.InvalidArgumentError, match=r"scale_fmt: got ue8m0, expected fp32 for a cache without scales"):
        mlajit.Op({"op": "sparse_prefill", "params": {"scale_fmt": "ue8m0"}})


def test_fp8_math_precompile_for_a_non_hopper_arch_is_refused_and_writes_nothing():
    before = set(os.listdir(mlajit.cache_dir())) if os.path.isdir(mlajit.cache_dir()) else set()
    with pytest.raises(mlajit.InvalidArgumentError, match=r"got sm_80, expected sm_90a.*qk_math fp8"):
        mlajit.precompile(FP8_MATH, arch="sm_80")
    after = set(os.listdir(mlajit.cache_dir())) if os.path.isdir(mlajit.cache_dir()) else set()
    assert after == before


def _nvrtc():
    return mlajit.info().get("nvrtc") is not None


@pytest.mark.skipif(not _nvrtc(), reason="NVRTC not found: precompile needs it (no GPU needed)")
def test_precompile_config_into_the_cache_dir_then_hits():
    cfg = {"arch": "sm_90a", "kernels": [dict(INDEX_REMAP, sweep={"threads": [128, 256]})]}
    r = mlajit.precompile(cfg)
    assert [(x["op"], x["arch"]) for x in r] == [("sparse_index_remap", "sm_90a")]
    again = mlajit.precompile(json.dumps(cfg), arch="sm_90a,sm_100a", jobs=2, progress=False)
    assert [x["cache_hit"] for x in again] == [True, False]  # the config's order, whatever finished first
    assert all(x["seconds"] >= 0 for x in again)
    with pytest.raises(mlajit.InvalidArgumentError, match="jobs"):
        mlajit.precompile(cfg, jobs=0)
    assert sum(n.endswith(".mjc") for n in os.listdir(mlajit.cache_dir())) >= 2  # one entry per arch


def test_runtime_with_its_own_cache_path(tmp_path):
    ro, rw, shared = tmp_path / "ro", tmp_path / "rw", tmp_path / "shared"
    ro.mkdir()
    ro.chmod(0o555)  # read-only layer: looked up, never written
    rt = mlajit.Runtime(cache_path=[ro, rw])
    assert rt.cache_dir == str(rw)
    op = rt.op(INDEX_REMAP)
    assert op.runtime is rt and op.params["page_size"] == 64
    if _nvrtc():
        assert [x["cache_hit"] for x in rt.precompile(INDEX_REMAP, arch="sm_90a")] == [False]
        assert [x["cache_hit"] for x in rt.precompile(INDEX_REMAP, arch="sm_90a")] == [True]
        assert sum(n.endswith(".mjc") for n in os.listdir(rw)) == 1 and os.listdir(ro) == []
    shared.mkdir()
    shared.chmod(0o770)
    with pytest.raises(mlajit.CacheError, match="writable by its group"):
        mlajit.Runtime(cache_path=str(shared))
    assert mlajit.Runtime(disable_disk_cache=True).cache_dir is None
    ro.chmod(0o755)


def test_plot_draws_a_report(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: python -m mlajit.plot untested")
    cand = lambda knobs, ms, default=False: {"knobs": knobs, "is_default": default, "devices": [
        {"device": 0, "status": "ok", "median_ms": ms, "min_ms": ms * 0.9, "max_ms": ms * 1.1}]}
    report = {"groups": [{"name": "kv_cache_store_x", "shape": {"T": 4096}, "devices": [{"device": 0, "winner": 1}],
                          "candidates": [cand({"threads": 128}, 0.3, True), cand({"threads": 256}, 0.2),
                                         {"knobs": {"threads": 1024}, "devices": [{"device": 0, "status": "skipped"}]}]}]}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(report))
    out = tmp_path / "r.png"
    subprocess.run([sys.executable, "-m", "mlajit.plot", str(src), "-o", str(out)], check=True)
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(not _nvrtc(), reason="NVRTC not found: nothing to log without a compile")
def test_log_handler_receives_the_library_messages():
    lines = []
    mlajit.set_log_handler(lambda level, msg: lines.append((level, msg)), level="debug")
    try:
        mlajit.precompile({"op": "sparse_index_remap", "params": {"page_size": 16}}, arch="sm_90a")
    finally:
        mlajit.set_log_handler(None, level="warn")
    assert lines and all(lv in ("error", "warn", "info", "debug") for lv, _ in lines)
    assert any("sparse_index_remap" in m for _, m in lines), lines


@pytest.mark.parametrize("blocked", [["torch"], ["torch", "mlajit._fastcall"]])
def test_eager_ops_without_torch_take_array_interface_objects(blocked):
    """Without torch (its import blocked in a fresh interpreter), an op takes objects with
    __cuda_array_interface__ and the library validates them: the C++ message reaches Python; the
    same through the ctypes launch path that serves when the C extension was not built."""
    code = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None  # its import raises ImportError\n"
    code += r'''
import mlajit
from mlajit import _launch
print("launch path:", _launch.impl.__name__)

class Array:
    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"data": (0x10000, False), "shape": shape, "typestr": typestr, "version": 3}

spec = {"op": "sparse_index_remap", "params": {"page_size": 64}}
try:
    mlajit.ops.sparse_index_remap(spec, Array((5, 64), "<u4"), Array((3,), "<u4"), Array((2, 4), "<u4"), 24,
                                  out=Array((5, 64), "<i4"))
except mlajit.InvalidArgumentError as e:
    print(e)
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "indices dtype: got u32, expected i32" in r.stdout, r.stdout + r.stderr
    expected = "mlajit._launch_ctypes" if "mlajit._fastcall" in blocked else "mlajit._fastcall"
    assert f"launch path: {expected}" in r.stdout


@pytest.mark.skipif(not _nvrtc(), reason="NVRTC not found: precompile needs it (no GPU needed)")
def test_packaged_cache_layer_serves_the_default_kernel_set(tmp_path):
    # The wheel carries the cubins of examples/deepseek_v32.json (cmake/prebuilt_cache.cmake); a
    # fresh process with an empty cache of its own finds the layer beside the library, after its
    # own layer, read-only, and precompiling the default config compiles nothing.
    layer = os.path.join(os.path.dirname(os.path.abspath(mlajit.__file__)), "prebuilt-cache")
    if not os.path.isdir(layer):
        pytest.skip("this package was built without its packaged cache layer (no NVRTC when it was built)")
    assert sum(n.endswith(".mjc") for n in os.listdir(layer)) >= 8
    assert not os.stat(layer).st_mode & 0o022  # not writable by group or others: the layer rules
    code = ("import json, sys, mlajit; i = mlajit.info(); "
            "r = mlajit.precompile(json.load(open(sys.argv[1])), arch='sm_90a'); "
            "print(json.dumps([i['cache_layers'], [x['cache_hit'] for x in r], len(r)]))")
    env = dict(os.environ, MLAJIT_CACHE_DIR=str(tmp_path / "own"))
    env.pop("MLAJIT_PREBUILT_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "examples", "deepseek_v32.json")], env=env,
                         capture_output=True, text=True, check=True)
    layers, hits, n = json.loads(out.stdout)
    assert [os.path.realpath(x["dir"]) for x in layers] == [os.path.realpath(tmp_path / "own"), os.path.realpath(layer)]
    assert [x["writable"] for x in layers] == [True, False]
    assert n == 8 and all(hits)
    assert not any(n.endswith(".mjc") for n in os.listdir(tmp_path / "own"))  # nothing compiled, nothing stored
