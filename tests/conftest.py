import os
import shutil
import tempfile

import pytest

# Every test session builds into its own cache unless told otherwise, so tests never see
# a developer's stale builds (CI sets MLAGEN_CACHE_DIR to a fresh folder too).
if "MLAGEN_CACHE_DIR" not in os.environ:
    os.environ["MLAGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="mlagen-test-cache-")


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    has_cuda, has_nvcc = _has_cuda(), shutil.which("nvcc") is not None
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)
