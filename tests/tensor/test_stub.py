"""``flowgraph/tensor/tensor.pyi`` declares every public name of ``Tensor`` and is regenerated, not hand-edited."""

from __future__ import annotations

import ast

from flowgraph.tensor import Tensor, _stub


def test_committed_stub_is_current():
    assert _stub.STUB_PATH.read_text() == _stub.generate(), (
        "flowgraph/tensor/tensor.pyi is stale: run `python -m flowgraph.tensor._stub` and commit the result"
    )


def test_stub_declares_every_public_name_and_parses():
    tree = ast.parse(_stub.STUB_PATH.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    declared = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    declared |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in dir(Tensor) if not n.startswith("_")}
    assert public - declared == set()
    assert {"add_", "matmul", "backward", "grad", "shape", "__add__", "__getitem__", "__iter__"} <= declared
