"""Catalogue of builder misuse: each raises a FlowError (or ShapeError) naming the call and the fix."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder, MergeOp

from .modules import Mix, Scale

L = nn.Linear


class Wrong(nn.Module):
    def forward(self, x):
        return fg.ones(x.shape[0], 3)


def _labelled(name):
    return FlowBuilder.from_(L(2, 2)).label(name).build()


def _with_input():
    return FlowBuilder.from_(L(2, 2)).input("ctx").through(Mix(2)).using("ctx").build()


CASES = {
    "open streams": (lambda: FlowBuilder.from_(L(2, 2)).split(L(2, 2), L(2, 2)).build(),
                     fg.FlowError, ["call #2 .split(Linear, Linear)", "open streams", ".merge(op)"]),
    "merge one stream": (lambda: FlowBuilder.from_(L(2, 2)).merge(MergeOp.ADD).build(),
                         fg.FlowError, ["call #2 .merge(MergeOp.ADD)", "only one stream", ".split("]),
    "unknown tag in using": (lambda: FlowBuilder.from_(L(2, 2)).tag("encoded").through(Mix(2)).using("encodd")
                             .build(), fg.FlowError,
                             ["call #4 .using('encodd')", "unknown tag", "did you mean 'encoded'"]),
    "unknown tag in map.over": (lambda: FlowBuilder().tag("rows").map(Scale(1.0)).over("rws").build(),
                                fg.FlowError, ["call #3 .map(Scale).over('rws')", "unknown tag", "'rows'"]),
    "duplicate tag": (lambda: FlowBuilder.from_(L(2, 2)).tag("h").through(L(2, 2)).tag("h").build(),
                      fg.FlowError, ["call #4 .tag('h')", "already defined by call #2", "another name"]),
    "duplicate label": (lambda: FlowBuilder.from_(_labelled("enc")).through(_labelled("enc")).build(),
                        fg.FlowError, ["duplicate label 'enc'", "call #2 .through(Graph 'enc')", "own .label()"]),
    "dotted label": (lambda: FlowBuilder.from_(L(2, 2)).label("enc.v1").build(),
                     fg.FlowError, ["call #2 .label('enc.v1')", "contains '.'", "'enc_v1'"]),
    "label twice": (lambda: FlowBuilder.from_(L(2, 2)).label("a").label("b").build(),
                    fg.FlowError, ["call #3 .label('b')", "already labelled 'a'"]),
    "ref to module without keyword": (lambda: FlowBuilder.from_(L(2, 2)).tag("h").through(L(2, 2)).using("h")
                                      .build(), fg.FlowError,
                                      ["call #4 .using('h')", "Linear", "cannot take the ref 'h'", "**kwargs"]),
    "ref to graph without that input": (lambda: FlowBuilder.from_(L(2, 2)).tag("h").through(_with_input())
                                        .using("h").build(), fg.FlowError, ["cannot take the ref 'h'", "['ctx']",
                                                                            ".input('h')"]),
    "cycle: using own output": (lambda: FlowBuilder.from_(L(2, 2)).through(nn.StateAdd()).tag("h").using("h")
                                .build(), fg.FlowError, ["call #4 .using('h')", "cycle", "before .tag('h')"]),
    "cycle: map over a later tag": (lambda: FlowBuilder().map(Scale(1.0)).over("later").tag("later").build(),
                                    fg.FlowError, ["call #2", "cycle", "call #3 .tag('later')"]),
    "empty split": (lambda: FlowBuilder.from_(L(2, 2)).split().merge(MergeOp.ADD).build(),
                    fg.FlowError, ["call #2 .split()", "at least 2", ".through(m)"]),
    "gate with one expert": (lambda: FlowBuilder().gate(nn.SoftmaxRouter(2, 1), [L(2, 2)]).build(),
                             fg.FlowError, ["call #2 .gate(", "at least 2 experts"]),
    "switch branches not a list": (lambda: FlowBuilder().switch(nn.FixedSelector(0), L(2, 2)).build(),
                                   fg.FlowError, ["call #2 .switch(", "list of modules"]),
    "not a module": (lambda: FlowBuilder.from_(L(2, 2)).through(lambda x: x).build(),
                     fg.FlowError, ["call #2 .through(", "must be an nn.Module", "forward()"]),
    "fork never tagged": (lambda: FlowBuilder.from_(L(2, 2)).fork(L(2, 1)).through(L(2, 2)).build(),
                          fg.FlowError, ["call #2 .fork(Linear)", "never tagged", ".tag(name)"]),
    "using with nothing before": (lambda: FlowBuilder().using("x").build(),
                                  fg.FlowError, ["call #2 .using('x')", "no module before it"]),
    "using without names": (lambda: FlowBuilder.from_(L(2, 2)).using().build(),
                            fg.FlowError, ["call #2 .using()", "at least one tag name"]),
    "using on a built-in merge": (lambda: FlowBuilder().tag("a").split(L(2, 2), L(2, 2)).merge(MergeOp.ADD)
                                  .using("a").build(), fg.FlowError, ["call #5 .using('a')", "cannot take refs"]),
    "same ref twice": (lambda: FlowBuilder().tag("ctx").through(Mix(2)).using("ctx").using("ctx").build(),
                       fg.FlowError, ["call #5 .using('ctx')", "already receives 'ctx'"]),
    "unfinished loop": (lambda: FlowBuilder().loop_body(L(2, 2)).build(),
                        fg.FlowError, [".loop_body(...) must be finished", ".for_n(n)"]),
    "unfinished map": (lambda: FlowBuilder().map(L(2, 2)).through(L(2, 2)),
                       fg.FlowError, [".map(...) must be finished", ".each()"]),
    "for_n zero": (lambda: FlowBuilder().loop_body(L(2, 2)).for_n(0).build(),
                   fg.FlowError, ["call #2 .loop_body(Linear).for_n(0)", ">= 1"]),
    "while max_iter zero": (lambda: FlowBuilder().loop_body(L(2, 2)).while_cond(nn.ThresholdHalt(0), 0).build(),
                            fg.FlowError, ["while_cond(ThresholdHalt, 0)", "max_iter must be an integer >= 1"]),
    "tag not an identifier": (lambda: FlowBuilder().tag("my tag").build(),
                              fg.FlowError, ["call #2 .tag('my tag')", "identifier"]),
    "input clashes with tag": (lambda: FlowBuilder().tag("ctx").input("ctx").build(),
                               fg.FlowError, ["call #3 .input('ctx')", "already defined"]),
    "tag init wrong type": (lambda: FlowBuilder().tag("h", init="zeros").build(),
                            fg.FlowError, ["call #2 .tag('h', init='zeros')", "Tensor or a function"]),
    "tag clashes with generated name": (lambda: FlowBuilder().through(L(2, 2)).through(L(2, 2)).tag("through_0")
                                        .build(), fg.FlowError, ["child name 'through_0' is used twice",
                                                                 "rename the tag"]),
    "merge op not callable": (lambda: FlowBuilder().split(L(2, 2), L(2, 2)).merge("add").build(),
                              fg.FlowError, ["call #3 .merge('add')", "MergeOp", "callable"]),
    "dry run shape mismatch": (lambda: FlowBuilder.from_(L(2, 4)).through(L(3, 2)).build(sample=fg.ones(5, 2)),
                               fg.ShapeError, ["build(sample=...)", "call #2 .through(Linear)", "(5, 4)"]),
    "also changes shape": (lambda: FlowBuilder.from_(L(2, 2)).also(L(2, 3)).build(sample=fg.ones(1, 2)),
                           fg.ShapeError, ["call #2 .also(Linear)", "keep the shape", ".through(m)"]),
    "router wrong width": (lambda: FlowBuilder().gate(Wrong(), [L(2, 2), L(2, 2)]).build(sample=fg.ones(2, 2)),
                           fg.ShapeError, ["call #2 .gate(Wrong", "one weight per expert", "(..., 2)"]),
    "loop condition wrong shape": (lambda: FlowBuilder().loop_body(L(2, 2)).until_cond(Wrong(), 3)
                                   .build(sample=fg.ones(2, 2)), fg.ShapeError, ["until_cond(Wrong, 3)",
                                                                                "one value per row"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_misuse(case):
    make, kind, words = CASES[case]
    with pytest.raises(kind) as info:
        make()
    assert isinstance(info.value, fg.FlowError)
    message = str(info.value)
    for word in words:
        assert word in message, f"{case}: {word!r} not in {message!r}"


def test_wrong_input_count_at_call_time():
    g = _with_input()
    x = fg.ones(1, 2)
    with pytest.raises(fg.FlowError, match=r"missing input\(s\) \['ctx'\]"):
        g(x)
    with pytest.raises(fg.FlowError, match=r"takes 2 input\(s\) \(x, ctx\) but got 3"):
        g(x, x, x)
    with pytest.raises(fg.FlowError, match="no input 'ctxx'; did you mean 'ctx'"):
        g(x, ctxx=x)
    with pytest.raises(fg.FlowError, match="both by position and by name"):
        g(x, x, ctx=x)
    plain = FlowBuilder.from_(L(2, 2)).build()
    with pytest.raises(fg.FlowError, match=r"declare more with \.input\(name\)"):
        plain(x, x)
    with pytest.raises(fg.FlowError, match="first positional argument"):
        plain()


def test_catalogue_is_large_enough():
    assert len(CASES) >= 20
