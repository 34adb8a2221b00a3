"""Graph as an nn.Module: stable names, nesting, modes and devices, structure hash, DOT/SVG, profiling."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder, Graph, MergeOp

from .modules import Dense, Mix, Scale, Tanh, close


def _showcase(d=8):
    encoder = Dense(4, d)
    head_a, head_b = nn.Linear(d, d), nn.Linear(d, d)
    refine = Dense(d, d)
    router = nn.SoftmaxRouter(d, 2)
    expert_a, expert_b = nn.Linear(d, d), nn.Linear(d, d)
    head = nn.Linear(d, 3)
    return (FlowBuilder.from_(encoder).tag("encoded")
            .split(head_a, head_b).merge(MergeOp.MEAN)
            .loop_body(refine).for_n(3)
            .gate(router, [expert_a, expert_b]).using("encoded")
            .through(head)
            .build())


def test_design_showcase_snippet_builds_and_runs():
    fg.manual_seed(0)
    g = _showcase()
    x = fg.randn(5, 4)
    y = g(x)
    assert y.shape == (5, 3)
    y.sum().backward()
    assert all(p.grad is not None for p in g.parameters())
    assert list(dict(g.named_children())) == [
        "encoded", "split_0_0", "split_0_1", "loop_0", "gate_0_router", "gate_0_expert_0", "gate_0_expert_1",
        "through_0",
    ]


def test_same_code_gives_same_keys_and_hash():
    a, b = _showcase(), _showcase()
    assert list(a.state_dict()) == list(b.state_dict())
    assert a.structural_hash() == b.structural_hash()
    assert len(a.structural_hash()) == 64
    b.load_state_dict(a.state_dict())
    x = fg.randn(2, 4)
    close(a(x), b(x))


def test_hash_changes_with_structure():
    a = FlowBuilder().through(nn.Linear(2, 3)).build()
    b = FlowBuilder().through(nn.Linear(2, 4)).build()
    c = FlowBuilder().also(nn.Linear(2, 2)).build()
    assert len({a.structural_hash(), b.structural_hash(), c.structural_hash()}) == 3


def test_untagged_insertion_does_not_rename_tagged():
    def build(extra: bool):
        b = FlowBuilder.from_(nn.Linear(2, 4))
        if extra:
            b = b.through(nn.Linear(4, 4))
        return b.through(nn.Linear(4, 4)).tag("hidden").through(nn.Linear(4, 2)).build()

    k1, k2 = list(build(False).state_dict()), list(build(True).state_dict())
    assert "hidden.weight" in k1 and "hidden.weight" in k2
    assert k1 == ["from_0.weight", "from_0.bias", "hidden.weight", "hidden.bias",
                  "through_0.weight", "through_0.bias"]
    assert k2[-4:] == ["hidden.weight", "hidden.bias", "through_1.weight", "through_1.bias"]


def test_naming_rule_for_every_verb():
    g = (FlowBuilder.from_(nn.Linear(2, 2))
         .through(Tanh()).also(nn.Linear(2, 2)).fork(nn.Linear(2, 1)).tag("side")
         .split(Scale(1.0), Scale(2.0)).merge(MergeOp.ADD)
         .loop_body(Scale(1.0)).until_cond(nn.ThresholdHalt(9.0), 2)
         .gate(nn.SoftmaxRouter(2, 2), [Scale(1.0), Scale(2.0)]).tag("moe")
         .switch(nn.FixedSelector(0), [Scale(1.0), Scale(2.0)])
         .map(Scale(1.0)).each()
         .build())
    assert list(dict(g.named_children())) == [
        "from_0", "through_0", "also_0", "side", "split_0_0", "split_0_1", "loop_0", "loop_0_cond",
        "moe_router", "moe_expert_0", "moe_expert_1", "switch_0_selector", "switch_0_branch_0",
        "switch_0_branch_1", "map_0",
    ]
    assert g.tags == {"side": "side", "moe": None}
    assert [n.name for n in g.nodes()] == [
        "from_0", "through_0", "also_0", "side", "split_0_0", "split_0_1", "merge_0", "loop_0", "moe",
        "switch_0", "map_0"]


def _encoder():
    scan = (FlowBuilder.from_(nn.Linear(3, 4)).through(nn.Linear(4, 4)).tag("hidden")
            .label("scan").build())
    read = FlowBuilder.from_(nn.Linear(4, 4)).label("read").build()
    return FlowBuilder.from_(scan).through(read).label("encoder").build()


def test_nested_labelled_graphs_give_dotted_keys():
    enc = _encoder()
    g = FlowBuilder.from_(enc).through(nn.Linear(4, 2)).tag("classifier").build()
    keys = list(g.state_dict())
    assert "encoder.scan.hidden.weight" in keys and "encoder.read.from_0.weight" in keys
    assert "classifier.weight" in keys
    assert list(g.subgraphs()) == ["encoder"]
    assert list(enc.subgraphs()) == ["scan", "read"]
    assert enc.label == "encoder" and enc.tags == {}
    assert g.subgraphs()["encoder"].subgraphs()["scan"].tags == {"hidden": "hidden"}
    assert g(fg.randn(2, 3)).shape == (2, 2)


def test_label_wins_over_tag_for_subgraph_child_name():
    enc = FlowBuilder.from_(nn.Linear(2, 2)).label("encoder").build()
    g = FlowBuilder.from_(enc).tag("encoded").through(nn.Linear(2, 1)).build()
    assert "encoder" in dict(g.named_children())
    assert g.tags == {"encoded": "encoder"}


def test_graph_inside_ordinary_module_and_inside_graph():
    inner = FlowBuilder.from_(nn.Linear(3, 3)).also(nn.Linear(3, 3)).label("block").build()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = inner
            self.out = nn.Linear(3, 1)

        def forward(self, x):
            return self.out(self.block(x))

    m = Model()
    x = fg.randn(4, 3)
    assert m(x).shape == (4, 1)
    assert "block.from_0.weight" in m.state_dict()
    outer = FlowBuilder.from_(inner).through(nn.Linear(3, 1)).build()
    close(outer(x), outer.through_0(inner(x)))
    assert isinstance(outer.block, Graph)


def test_train_eval_and_to(device):
    g = FlowBuilder.from_(nn.Linear(2, 2)).through(nn.StateAdd()).using("h").tag("h").build()
    g.eval()
    assert all(not m.training for m in g.modules())
    g.train()
    assert all(m.training for m in g.modules())
    g(fg.ones(1, 2))
    g.to(device)
    assert all(p.device == fg.device(device) for p in g.parameters())
    assert g._state["h"].device == fg.device(device)
    y = g(fg.ones(1, 2, device=device))
    assert y.device == fg.device(device)
    g.double()
    assert all(p.dtype == fg.float64 for p in g.parameters())


def test_prefix_sharing_builders_are_independent():
    base = FlowBuilder.from_(nn.Linear(2, 2))
    a = base.through(nn.Linear(2, 3)).build()
    b = base.through(nn.Linear(2, 5)).build()
    x = fg.randn(1, 2)
    assert a(x).shape == (1, 3) and b(x).shape == (1, 5)
    assert a.from_0 is b.from_0


def test_dry_run_with_sample_restores_state():
    g = (FlowBuilder.from_(nn.Linear(2, 2)).through(nn.StateAdd()).using("h").tag("h")
         .build(sample=fg.ones(3, 2)))
    assert g._state == {} and g.tag_values == {}
    assert all(m.training for m in g.modules())
    g2 = FlowBuilder.from_(nn.Linear(2, 2)).input("ctx").through(Mix(2)).using("ctx") \
        .build(sample=(fg.ones(1, 2), fg.ones(1, 2)))
    assert g2.input_names == ["ctx"]


def test_dot_has_shapes_refs_forward_refs_and_clusters():
    enc = _encoder()
    g = (FlowBuilder.from_(enc).tag("e").through(nn.StateAdd()).using("h", "e").tag("h")
         .loop_body(Scale(1.0)).for_n(2)
         .gate(nn.SoftmaxRouter(4, 2), [Scale(1.0), Scale(2.0)])
         .switch(nn.FixedSelector(0), [Scale(1.0), Scale(2.0)])
         .split(Scale(1.0), Scale(2.0)).merge(MergeOp.CAT)
         .build())
    dot = g.dot()
    assert dot.startswith("digraph")
    assert 'subgraph "cluster_encoder"' in dot and 'subgraph "cluster_encoder.scan"' in dot
    assert "shape=doubleoctagon" in dot and "shape=trapezium" in dot and "shape=diamond" in dot
    assert "shape=circle" in dot and "shape=invhouse" in dot
    assert "style=dashed, color=blue" in dot          # backward ref 'e'
    assert "style=dotted, color=red" in dot           # forward ref 'h'


def test_svg_written_and_missing_graphviz_reported(tmp_path, monkeypatch):
    g = FlowBuilder.from_(nn.Linear(2, 2)).through(Tanh()).build()
    path = tmp_path / "g.svg"
    try:
        svg = g.svg(str(path))
    except fg.FlowError:
        pytest.skip("Graphviz 'dot' is not installed here")
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg
    assert path.read_text().count("<svg") == 1

    import graphviz

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    with pytest.raises(fg.FlowError, match="apt-get install graphviz"):
        g.svg()


def test_profiling(tmp_path):
    g = _showcase().enable_profiling()
    g(fg.randn(4, 4))
    prof = g.profile()
    assert list(prof) == [n.name for n in g.nodes()]
    assert all(t >= 0 for t in prof.values())
    dot_with_heat = __import__("flowgraph.builder.visual", fromlist=["to_dot"]).to_dot(g, profile=prof)
    assert "fillcolor" in dot_with_heat
    try:
        g.svg_with_profile(str(tmp_path / "p.svg"))
    except fg.FlowError as exc:
        assert "Graphviz" in str(exc)
    g.disable_profiling()
    g(fg.randn(4, 4))
    assert g.profile() == prof


def test_structure_is_json_and_describes_nodes():
    import json

    g = _showcase()
    s = g.structure()
    json.dumps(s)
    assert [e["verb"] for e in s] == ["from", "split", "split", "merge", "loop", "gate", "through"]
    assert s[0]["tag"] == "encoded" and s[0]["module"] == "Dense"
    assert s[0]["params"][0] == ["encoded.lin.weight", [8, 4]]


def test_shared_module_is_one_parameter_set():
    lin = nn.Linear(2, 2)
    g = FlowBuilder().through(lin).through(Tanh()).through(lin).build()
    assert len(list(g.parameters())) == 2
    assert {"through_0.weight", "through_2.weight"} <= set(g.state_dict())
    x = fg.randn(3, 2)
    close(g(x), lin(lin(x).tanh()))


def test_same_labelled_graph_twice_shares_weights():
    block = FlowBuilder.from_(nn.Linear(2, 2)).label("block").build()
    g = FlowBuilder.from_(block).through(block).build()
    assert list(dict(g.named_children())) == ["block"]
    x = fg.randn(1, 2)
    close(g(x), block(block(x)))


def test_dot_nodes_carry_ids_tooltips_and_details():
    import re

    import flowgraph as fg
    from flowgraph import nn
    from flowgraph.builder import FlowBuilder

    inner = FlowBuilder.from_(nn.Linear(4, 4)).through(nn.ReLU()).label("enc").build()
    g = FlowBuilder.from_(inner).through(nn.Linear(4, 2)).tag("head").build()
    g.freeze("enc")
    dot = g.dot()
    ids = re.findall(r'id="fg:([^"]+)"', dot)
    details = g.node_details()
    assert ids == [d["id"] for d in details]
    assert len(ids) == len(set(ids)) == 6  # in_x, enc.from_0, enc.through_0, enc.out, head, out
    by_id = {d["id"]: d for d in details}
    assert by_id["enc.from_0"]["parameters"] == 20 and by_id["enc.from_0"]["frozen"] == "frozen"
    assert by_id["head"]["frozen"] == "trainable" and by_id["head"]["trainable"] == 10
    assert by_id["enc.through_0"]["frozen"] == "no parameters"
    assert 'tooltip="enc.from_0\\nLinear\\n20 parameters (frozen)"' in dot
    with pytest.raises(fg.FlowError, match="no profile yet"):
        g.dot(profile=True)
    g.enable_profiling()
    g(fg.randn(3, 4))
    assert "fillcolor" in g.dot(profile=True) and "fillcolor" not in g.dot()
    timed = g.node_details(profile=True)
    shares = {d["id"]: d["share"] for d in timed if "share" in d}
    assert shares["enc.from_0"] > 0 and shares["head"] > 0  # a subgraph's nodes are timed by its own profile
    assert 0.5 < sum(shares.values()) <= 1.0 + 1e-9
