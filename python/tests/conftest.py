"""Every test process gets its own cache directory: the library reads MLAJIT_CACHE_DIR once, at
its first use, so it is set before mlajit is imported."""
import os
import tempfile

os.environ.setdefault("MLAJIT_CACHE_DIR", tempfile.mkdtemp(prefix="mlajit-pytest-cache-"))
