"""``backends.heap.retain_freed_memory``: with the NumPy backend created, a training-step-like pattern of
allocating and freeing tens of MiB reuses mapped pages instead of faulting fresh ones in every round (glibc),
and a user's own ``malloc`` tuning is left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from flowgraph.backends import get_backend
from flowgraph.backends.heap import retain_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _faults_per_round(rounds: int = 6) -> float:
    """Minor page faults per round of 24 arrays of 1 MiB written then freed (as a step's activations are),
    after one warm-up round."""
    import resource

    def one_round():
        arrays = [np.empty(1 << 18, dtype=np.float32) for _ in range(24)]
        for a in arrays:
            a.fill(1.0)
        del arrays

    one_round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        one_round()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_numpy_backend_keeps_freed_memory_mapped():
    get_backend("cpu")  # creating the backend sets the thresholds
    assert retain_freed_memory() is True
    # 24 MiB per round is 6144 pages: faulting them in every round is what the thresholds prevent
    assert _faults_per_round() < 100


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_user_malloc_tuning_is_left_alone():
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="131072")
    code = "from flowgraph.backends.heap import retain_freed_memory; print(retain_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
