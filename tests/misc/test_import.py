"""``import flowgraph`` loads the core only: the rest comes on first attribute access (the lazy table)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ["flowgraph.nn", "flowgraph.optim", "flowgraph.builder", "flowgraph.tree", "flowgraph.monitor",
         "flowgraph.distributed", "flowgraph.utils", "rich",
         "starlette", "uvicorn", "graphviz", "pyopencl", "cupy", "torch", "safetensors"]


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys; {code}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_flowgraph_loads_the_core_only():
    loaded = _loaded_after("import flowgraph")
    assert not [m for m in HEAVY if m in loaded]


def test_lazy_names_load_on_first_use():
    loaded = _loaded_after("import flowgraph as fg; fg.FlowBuilder; fg.nn.Linear")
    assert {"flowgraph.builder", "flowgraph.nn", "flowgraph.tree"} <= loaded
    assert "flowgraph.monitor" not in loaded and "starlette" not in loaded


def test_graph_has_the_tree_methods_without_importing_the_tree_first():
    loaded = _loaded_after("from flowgraph.builder import Graph; assert callable(Graph.freeze)")
    assert "flowgraph.builder" in loaded
