"""The shared graph queries, on real exported graphs in the ATen and edge dialects."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from torch.fx import Node

from etkit_quant.graph import (
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    is_shape_op,
    target_name,
    value_source,
)


class Warp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(self.conv(image), grid, align_corners=False)


def _example() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 3, 8, 8), torch.rand(1, 4, 4, 2) * 2 - 1


def _call_nodes(graph: torch.fx.Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == "call_function"]


def test_grid_sampler_found_in_aten_and_edge_dialects() -> None:
    exported = torch.export.export(Warp().eval(), _example(), strict=True)
    aten_hits = [n for n in _call_nodes(exported.graph) if is_grid_sampler(n)]
    assert len(aten_hits) == 1
    edge = to_edge(exported).exported_program()
    edge_hits = [n for n in _call_nodes(edge.graph) if is_grid_sampler(n)]
    assert [target_name(n) for n in edge_hits] == ["aten::grid_sampler_2d"]
    # the convolution is neither a grid sampler nor a quantize/dequantize
    others = [n for n in _call_nodes(edge.graph) if not is_grid_sampler(n)]
    assert others and not any(is_quantize(n) or is_dequantize(n) for n in others)


def test_quantize_and_dequantize_after_pt2e_convert() -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    example = _example()
    exported = torch.export.export(Warp().eval(), example, strict=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*example)
    converted = convert_pt2e(prepared)
    nodes = _call_nodes(converted.graph)
    quantizes = [n for n in nodes if is_quantize(n)]
    dequantizes = [n for n in nodes if is_dequantize(n)]
    assert quantizes and dequantizes
    assert not set(quantizes) & set(dequantizes)
    assert all("quantize_per_tensor" in target_name(n) for n in quantizes)


def test_non_call_nodes_have_no_target_name() -> None:
    exported = torch.export.export(Warp().eval(), _example(), strict=True)
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]
    assert placeholders
    assert all(target_name(n) == "" and not is_grid_sampler(n) for n in placeholders)


class Shapes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.view(1, 3, 16).permute(0, 2, 1).unsqueeze(0).flatten(1)[:, 1:]
        return torch.relu(y.reshape(-1)) + 1


def test_shape_ops_in_aten_and_edge_dialects() -> None:
    exported = torch.export.export(Shapes(), (torch.randn(1, 3, 4, 4),), strict=True)
    for program in (exported, to_edge(exported).exported_program()):
        nodes = _call_nodes(program.graph)
        shapes = [target_name(n) for n in nodes if is_shape_op(n)]
        assert len(shapes) >= 5, shapes
        others = [target_name(n) for n in nodes if not is_shape_op(n)]
        assert any("relu" in name for name in others) and any("add" in name for name in others)


def test_grid_positions_of_a_graph_deeper_than_the_recursion_limit() -> None:
    """A chain of 3000 ops between an input and a sampler (RAFT-small's graph is that deep):
    the walk over users recurses only along views and in-place writes, never along the
    chain (before: RecursionError in the channels-last pass)."""
    import sys

    from etkit_quant.graph import grid_position_nodes

    graph = torch.fx.Graph()
    image, grid = graph.placeholder("image"), graph.placeholder("grid")
    value = image
    depth = sys.getrecursionlimit() * 3
    for _ in range(depth):
        value = graph.call_function(torch.ops.aten.relu.default, (value,))
    sampled = graph.call_function(
        torch.ops.aten.grid_sampler_2d.default, (value, grid, 0, 0, False)
    )
    graph.output(sampled)
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert grid_position_nodes(module) == set()  # nothing but the sampler reads the chain
    assert grid_position_nodes(module, include_inputs=True) == {grid}


class _MovedThenComputed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moved = torch.relu(x).permute(0, 2, 3, 1).reshape(1, -1)[:, :5]
        return moved * 2


def test_value_source_walks_up_the_ops_that_only_move_values() -> None:
    exported = torch.export.export(_MovedThenComputed(), (torch.randn(1, 3, 4, 4),), strict=True)
    nodes = {target_name(n).split(".")[0]: n for n in _call_nodes(exported.graph)}
    product = nodes["aten::mul"]
    source, passed = value_source(product.args[0])
    assert target_name(source) == "aten::relu"
    assert [target_name(n).split(".")[0] for n in passed] == [
        "aten::slice",
        "aten::reshape",
        "aten::permute",
    ], [target_name(n) for n in passed]
    # a computing op is its own source; another notion of moving stops elsewhere
    assert value_source(product) == (product, [])
    not_permute = value_source(product.args[0], lambda n: "permute" not in target_name(n))
    assert target_name(not_permute[0]) == "aten::permute" and len(not_permute[1]) == 2
