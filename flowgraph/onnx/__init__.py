"""ONNX export: ``fg.onnx.export(model, sample, "model.onnx")`` for Graphs and nn modules.

Needs the ``onnx`` extra (``pip install 'flowgraph[onnx]'``: onnx, and onnxruntime to run the result). See
``docs/tutorials/15-onnx-export.md``.
"""

from __future__ import annotations

from .export import export

__all__ = ["export"]
