"""``benchmarks/fallbacks.py`` finds the generic defaults a backend's training step falls back to: a layout
that sends a composite to its generic default is a slow path no timing test would flag."""

import collections

import pytest

from benchmarks.fallbacks import count_fallbacks
from flowgraph.backends.array_backend import NumpyBackend
from flowgraph.backends.base import Backend


def test_counts_a_fallback_and_restores_the_methods(monkeypatch):
    """A NumPy override made to hand every call to the generic default is counted, with its shapes; the base
    methods are the originals again afterwards."""
    before = vars(Backend)["batch_norm"]

    def always_generic(self, x, *args, **kwargs):
        return Backend.batch_norm(self, x, *args, **kwargs)

    monkeypatch.setattr(NumpyBackend, "batch_norm", always_generic)
    counts = count_fallbacks("cpu", ["convnet"], scale=0.125)["convnet"]
    bn = collections.Counter({k: n for k, n in counts.items() if k[0] == "Backend.batch_norm"})
    assert sum(bn.values()) == 5  # convnet's five batch norms, each once in the counted step
    assert all(len(shapes[0]) == 4 for _, shapes in bn)
    assert vars(Backend)["batch_norm"] is before


@pytest.mark.parametrize("name", ["dcgan_g", "dcgan_d"])
def test_dcgan_steps_take_no_generic_default(device, name):
    """DCGAN's generator (padded transposed convolutions into batch norms) and discriminator reach no generic
    default on any backend, the deliberate ones excepted: OpenCL's biased convolution where its forward is split
    over the reduction, and NumPy's own ``np.sum`` for a sum the BLAS form does not take (the loss's, over every
    axis)."""
    counts = count_fallbacks(device, [name], scale=0.125)[name]
    deliberate = {"Backend.conv_forward_bias", "ArrayBackend.sum"}
    unexpected = {k: n for k, n in counts.items() if k[0] not in deliberate}
    assert not unexpected, unexpected
