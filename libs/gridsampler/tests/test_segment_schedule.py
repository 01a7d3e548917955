"""``schedule_segments``: the order of a lowered VGF graph that model-converter cuts into the
fewest segments, with no graph segment left without a result (model-converter 0.11 exits 255 on
one). Built on plain FX graphs: a node with the custom-shader domain stands for a compute op."""

from __future__ import annotations

import operator

from torch.fx import Graph, Node

from etkit_gridsampler.vgf_shader import schedule_segments
from etkit_gridsampler.vgf_shader.payload import DOMAIN


def _graph_op(*args: object) -> object:
    return args[0]


def _custom(inputs: list[Node], **kwargs: object) -> object:
    return inputs


def _order(graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes if n.op == "call_function"]


def _twin_warps() -> tuple[Graph, dict[str, Node]]:
    """Two samplers on one grid, one image each; the first's result is requantized, then
    added to the second's. In the order Arm's lowering emits: the second image's conv comes
    after the first sampler's requantize."""
    graph = Graph()
    x = graph.placeholder("x")
    n: dict[str, Node] = {}
    n["grid"] = graph.call_function(_graph_op, (x,), name="grid")
    n["image_a"] = graph.call_function(_graph_op, (x,), name="image_a")
    n["sample_a"] = graph.call_function(
        _custom, ([n["image_a"], n["grid"]],), {"domain_name": DOMAIN}, name="sample_a"
    )
    n["item_a"] = graph.call_function(operator.getitem, (n["sample_a"], 0), name="item_a")
    n["rescale_a"] = graph.call_function(_graph_op, (n["item_a"],), name="rescale_a")
    n["conv_b"] = graph.call_function(_graph_op, (x,), name="conv_b")
    n["sample_b"] = graph.call_function(
        _custom, ([n["conv_b"], n["grid"]],), {"domain_name": DOMAIN}, name="sample_b"
    )
    n["item_b"] = graph.call_function(operator.getitem, (n["sample_b"], 0), name="item_b")
    n["add"] = graph.call_function(_graph_op, (n["rescale_a"], n["item_b"]), name="add")
    graph.output((n["add"],))
    return graph, n


def test_a_graph_op_after_one_sampler_waits_for_the_independent_one() -> None:
    graph, _ = _twin_warps()
    assert schedule_segments(graph)
    assert _order(graph) == [
        "grid", "image_a", "conv_b",  # the first graph wave
        "sample_a", "item_a", "sample_b", "item_b",  # both compute ops, one after the other
        "rescale_a", "add",  # the second graph wave
    ]  # fmt: skip
    graph.lint()  # still a topological order


def test_a_sampler_reading_another_stays_after_it_and_order_is_kept_when_nothing_moves() -> None:
    graph = Graph()
    x = graph.placeholder("x")
    first = graph.call_function(_custom, ([x, x],), {"domain_name": DOMAIN}, name="first")
    item = graph.call_function(operator.getitem, (first, 0), name="item")
    between = graph.call_function(_graph_op, (item,), name="between")
    second = graph.call_function(_custom, ([between, x],), {"domain_name": DOMAIN}, name="second")
    graph.output((graph.call_function(operator.getitem, (second, 0), name="out"),))
    before = _order(graph)
    assert not schedule_segments(graph)
    assert _order(graph) == before


def test_one_sampler_is_left_as_it_is() -> None:
    graph = Graph()
    x = graph.placeholder("x")
    sample = graph.call_function(_custom, ([x, x],), {"domain_name": DOMAIN}, name="sample")
    item = graph.call_function(operator.getitem, (sample, 0), name="item")
    late = graph.call_function(_graph_op, (x,), name="late")  # could move before the sampler
    graph.output((graph.call_function(_graph_op, (item, late), name="add"),))
    before = _order(graph)
    assert not schedule_segments(graph)
    assert _order(graph) == before
