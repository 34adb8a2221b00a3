"""The device side of ``fg.capture``: a side stream, a private memory pool and one CUDA graph.

``GraphSession`` knows nothing of tensors (``flowgraph.runtime`` drives it): it runs warm-up work on a
non-blocking side stream with allocations from a pool of its own, records the capture there, and replays
the graph on the caller's current stream. The pool lives as long as the session: every address the graph
reads or writes came from it (or existed before), and nothing else ever allocates from it, so no replay
can scribble over memory handed to someone else. CuPy has no per-graph pool, hence this one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import cupy

from ...errors import FlowError

if TYPE_CHECKING:
    from .backend import CupyBackend


class GraphSession:
    """Warm-up, capture and replay of one step on one CUDA device."""

    def __init__(self, backend: CupyBackend):
        self.backend = backend
        with backend._device:
            self.pool = cupy.cuda.MemoryPool()
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graph: Any = None

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        with self.backend._device, cupy.cuda.using_allocator(self.pool.malloc):
            caller = cupy.cuda.get_current_stream()
            # The side stream starts after everything queued so far (parameters, inputs).
            self.stream.wait_event(caller.record())
            with self.stream:
                yield

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        """Run eager work on the side stream (kernels compile, the pool fills, optimizer state appears)."""
        with self._on_side_stream():
            yield
        self.stream.synchronize()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Record everything queued inside the block into ``self.graph`` (nothing runs now)."""
        backend = self.backend
        with self._on_side_stream():
            self.stream.begin_capture()
            backend.capturing = True
            try:
                yield
            except BaseException:
                backend.capturing = False
                with contextlib.suppress(Exception):
                    self.stream.end_capture()
                raise
            backend.capturing = False
            try:
                self.graph = self.stream.end_capture()
            except Exception as exc:
                raise FlowError(
                    f"CUDA graph capture failed ({exc}); every op inside fg.capture must run on the GPU "
                    "without host synchronisation"
                ) from exc

    def replay(self, copies: Iterable[tuple[Any, Any]] = ()) -> None:
        """Launch the captured graph on the current stream, after copying each ``(static, source)`` pair of
        ``copies`` into the static input the graph reads.

        A copy between dense arrays of one dtype and shape (a replay's usual batch) is one device-to-device
        memcpy on the stream, not a kernel built by the lazy engine: a replay's host time before its launch is
        what a step that reads its loss every time waits for."""
        if self.graph is None:
            raise FlowError("replay() before a successful capture")
        backend = self.backend
        backend._use()
        stream = cupy.cuda.get_current_stream()
        for static, source in copies:
            dst, src = backend._arr(static), backend._arr(source)
            if src.dtype == dst.dtype and src.shape == dst.shape and src.flags.c_contiguous and dst.flags.c_contiguous:
                if dst.nbytes:
                    backend._flush_readers(id(dst.data.mem))  # pending readers of the old values first
                    _copy(dst, src, stream.ptr)
            else:
                backend.assign(dst, src)
        self.graph.launch(stream=stream)

    def copy_out(self, a: Any) -> Any:
        """A new array with ``a``'s values (a graph output, which the next launch overwrites), queued on the
        current stream: one memcpy for a dense ``a``."""
        backend = self.backend
        backend._use()
        src = backend._arr(a)
        if not src.flags.c_contiguous:
            return src.copy()  # C order
        out = cupy.empty(src.shape, dtype=src.dtype)
        if src.nbytes:
            _copy(out, src, cupy.cuda.get_current_stream().ptr)
        return out


def _copy(dst: Any, src: Any, stream: int) -> None:
    """Queue ``dst[...] = src`` (dense arrays of one dtype and size) as one device-to-device copy on ``stream``;
    the runtime call, since ``MemoryPointer``'s copy checks peer access on every call."""
    runtime = cupy.cuda.runtime
    runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, runtime.memcpyDeviceToDevice, stream)
