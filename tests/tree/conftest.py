"""A small tree of labelled graphs shared by the tree tests:

    root
    ├── encoder (label)
    │   ├── scan (label): Linear -> tag "hidden", GELU, Linear -> internal tag "_inner"
    │   └── read (label): Linear -> tag "proj"
    ├── BatchNorm1d -> tag "norm"
    └── Linear -> tag "classifier"
"""

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder


def make_encoder():
    scan = (FlowBuilder.from_(nn.Linear(4, 8)).tag("hidden").through(nn.GELU())
            .through(nn.Linear(8, 8)).tag("_inner").label("scan").build())
    read = FlowBuilder.from_(nn.Linear(8, 8)).tag("proj").label("read").build()
    return FlowBuilder.from_(scan).through(read).label("encoder").build()


def make_model(seed=0, extra_identity=False):
    fg.manual_seed(seed)
    fb = FlowBuilder.from_(make_encoder())
    if extra_identity:
        fb = fb.through(nn.Identity())
    return fb.through(nn.BatchNorm1d(8)).tag("norm").through(nn.Linear(8, 2)).tag("classifier").build()


@pytest.fixture
def model():
    return make_model()
