"""Which generic defaults a backend's training step falls back to: a search for hidden slow paths.

Every method a backend class overrides is looked up in its base classes, and those base versions are wrapped.
A call that reaches one with the backend itself as ``self`` (the override handed the work on through ``super()``:
an unexpected layout, dtype or size) is counted, with the shapes of its first array arguments, during one eager
training step of each benchmark model (after one untimed step). Some fallbacks are deliberate (tiny rows, a
split reduction); any other is a lead. dcgan_g's batch norms were found this way, taking the generic default
behind a cropped transposed convolution (``docs/benchmark.md``, twenty-eighth session).

    python -m benchmarks.fallbacks --device cpu
    python -m benchmarks.fallbacks --device opencl:0 --models convnet,dcgan_g
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Sequence
from typing import Any

from flowgraph.backends import get_backend

from .models import MODELS, flowgraph_training


def _install(backend_type: type, counts: collections.Counter, active: list[bool]) -> list[tuple]:
    """Wrap the base-class version of each method ``backend_type`` overrides to count calls made with an
    instance of exactly ``backend_type`` while ``active[0]`` is set; returns ``(class, name, original)`` of each
    wrapped method, for ``_restore``."""
    wrapped = []
    for name, fn in list(vars(backend_type).items()):
        if name.startswith("__") or not callable(fn) or isinstance(fn, (staticmethod, classmethod)):
            continue
        for base in backend_type.__mro__[1:]:
            original = vars(base).get(name)
            if original is None:
                continue
            if callable(original) and not isinstance(original, (staticmethod, classmethod)):
                setattr(base, name, _counting(original, f"{base.__name__}.{name}", backend_type, counts, active))
                wrapped.append((base, name, original))
            break
    return wrapped


def _restore(wrapped: list[tuple]) -> None:
    for base, name, original in reversed(wrapped):
        setattr(base, name, original)


def _counting(original: Any, label: str, backend_type: type, counts: collections.Counter, active: list[bool]):
    def wrapper(self, *args, **kwargs):
        if active[0] and type(self) is backend_type:
            shapes = tuple(tuple(a.shape) for a in args[:3] if hasattr(a, "shape"))
            counts[(label, shapes)] += 1
        return original(self, *args, **kwargs)

    return wrapper


def _step(model: Any, opt: Any, x: Any, y: Any, loss_fn: Any) -> None:
    """One eager training step."""
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()


def count_fallbacks(device: str, models: Sequence[str], scale: float = 0.25) -> dict[str, collections.Counter]:
    """Per model, ``{(base-class method, shapes of its first array arguments): calls}`` of the generic defaults
    that one training step (after an untimed one) reached on ``device``'s backend."""
    backend = get_backend(device)
    counts: collections.Counter = collections.Counter()
    active = [False]
    result = {}
    wrapped = _install(type(backend), counts, active)
    try:
        for name in models:
            training = flowgraph_training(name, scale, device)
            _step(*training)
            active[0] = True
            _step(*training)
            backend.synchronize()
            active[0] = False
            result[name] = collections.Counter(counts)
            counts.clear()
    finally:
        active[0] = False
        _restore(wrapped)
    return result


def main() -> None:
    """Print, per model, the generic defaults one training step reached and how often."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {tuple(MODELS)}")
    parser.add_argument("--scale", type=float, default=0.25)
    args = parser.parse_args()
    for name, counts in count_fallbacks(args.device, args.models.split(","), args.scale).items():
        print(f"{name}: {sum(counts.values())} generic-default calls")
        for (label, shapes), n in counts.most_common():
            print(f"  {n:4d}  {label}  {shapes}")


if __name__ == "__main__":
    main()
