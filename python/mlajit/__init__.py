"""mlajit: JIT-specialized DeepSeek-V3.2 sparse MLA kernels for torch (and any CUDA array).

    import mlajit
    mlajit.precompile("examples/deepseek_v32.json", arch="sm_90a")   # no GPU needed
    out, lse = mlajit.ops.sparse_prefill(spec, q, kv_blocks, indices, topk_lengths, softmax_scale=s)

The cache directory and every MLAJIT_* environment variable mean what they mean for the C++
library and the CLI (mlajit.info() shows them).
"""
from ._lib import (CacheError, CompileError, DriverError, InvalidArgumentError, MlajitError)  # noqa: F401
from ._core import Op, Runtime, cache_dir, get_op, info, precompile, set_log_handler, version  # noqa: F401
from . import ops  # noqa: F401

__version__ = version()

try:
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None
if _torch is not None:
    from . import _torch_ops  # noqa: F401  (registers torch.ops.mlajit.*)
