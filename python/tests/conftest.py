"""Every test process gets its own cache directory: the library reads MLAJIT_CACHE_DIR once, at
its first use, so it is set before mlajit is imported. The packaged cache layer is off, so that
tests which compile do compile; test_package.py checks the layer in a process of its own."""
import os
import tempfile

os.environ.setdefault("MLAJIT_CACHE_DIR", tempfile.mkdtemp(prefix="mlajit-pytest-cache-"))
os.environ.setdefault("MLAJIT_PREBUILT_CACHE", "off")
