"""``DetagMovedQuantizes`` and ``integer_moves``: a pad (or a move) left outside XNNPACK's
delegates between a dequantize and a quantize of the same parameters runs on the integers, the
dequantize and quantize gone, and the program computes exactly what it computed before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from etkit_partition import (
    DetagMovedQuantizes,
    DetagOps,
    DetagQuantizedPads,
    PolicyPartitioner,
    integer_moves,
)
from etkit_quant.graph import is_dequantize, is_quantize, target_name


class PadBetweenConvs(torch.nn.Module):
    """A pad of a conv's output with a constant that is not 0 (-0.3: its quantized value is
    not the zero point), read by another conv. The convs are kept out of the delegates
    (``DetagOps``), so the pad's quantize stays outside with it, as the RGBA pad of an image
    read by etkit's grid sampler does."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv2d(3, 4, 1)
        self.second = torch.nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(F.pad(self.first(x), [1, 1, 1, 1], value=-0.3))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1,)


def _converted() -> torch.export.ExportedProgram:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    inputs = _inputs()
    exported = torch.export.export(PadBetweenConvs().eval(), inputs, strict=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    return torch.export.export(convert_pt2e(prepared), inputs, strict=True)


def _lowered(moves: bool) -> tuple[Any, list[str]]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    policies = [DetagQuantizedPads(), DetagOps([torch.ops.aten.convolution.default])]
    partitioner = PolicyPartitioner(XnnpackPartitioner(), policies)
    manager = to_edge_transform_and_lower(_converted(), partitioner=[partitioner])
    rewritten = integer_moves(manager.exported_program()) if moves else []
    return manager, rewritten


def _run(manager: Any) -> torch.Tensor:
    import executorch.kernels.quantized  # noqa: F401  (the Q/DQ kernels around delegates)
    from executorch.runtime import Runtime

    program = bytes(manager.to_executorch().buffer)
    method = Runtime.get().load_program(program).load_method("forward")
    output: torch.Tensor = method.execute(list(_inputs()))[0]
    return output


@pytest.mark.slow
def test_a_pad_outside_the_delegates_pads_the_integers_and_computes_the_same() -> None:
    manager, rewritten = _lowered(moves=True)
    (pad,) = [
        n
        for n in manager.exported_program().graph.nodes
        if target_name(n).startswith("aten::constant_pad_nd")
    ]
    assert rewritten == [pad.name]
    source = pad.args[0]
    assert source.meta["val"].dtype == torch.int8  # the integers, not a dequantize's floats
    assert not is_dequantize(source)
    assert not any(is_quantize(u) for u in pad.users)
    assert isinstance(pad.args[2], int) and pad.args[2] != 0  # -0.3 quantized, in steps
    before, _ = _lowered(moves=False)
    assert torch.equal(_run(manager), _run(before))


def test_only_equal_parameters_are_rewritten() -> None:
    """A move whose quantize has other parameters than its dequantize is left as it is."""
    from torch.fx import Graph, GraphModule

    graph = Graph()
    x = graph.placeholder("x")
    dq = graph.call_function(
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        (x, 0.1, 0, -128, 127, torch.int8),
    )
    moved = graph.call_function(torch.ops.aten.permute_copy.default, (dq, [0, 2, 1]))
    q = graph.call_function(
        torch.ops.quantized_decomposed.quantize_per_tensor.default,
        (moved, 0.2, 0, -128, 127, torch.int8),
    )
    graph.output(q)
    module = GraphModule(torch.nn.Module(), graph)

    class Program:
        def __init__(self, gm: GraphModule) -> None:
            self.graph_module, self.graph = gm, gm.graph

    assert integer_moves(Program(module)) == []  # type: ignore[arg-type]
    q.args = (moved, 0.1, 0, -128, 127, torch.int8)
    q.meta["val"] = torch.empty(1, 3, 2, dtype=torch.int8)
    assert integer_moves(Program(module)) == [moved.name]
    assert moved.args[0] is x and list(module.graph.nodes)[-1].args[0] is moved


def _tagged_chain(second_tag: str) -> tuple[Any, Any]:
    """x -> [P: relu] -> dq -> permute -> q -> [second_tag: dq -> relu] -> output, tagged."""
    from torch.fx import Graph, GraphModule

    from etkit_partition.policies import TAG_KEY

    graph = Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.aten.relu.default, (x,))
    first.meta[TAG_KEY] = "P"
    dq = graph.call_function(
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        (first, 0.1, 0, -128, 127, torch.int8),
    )
    moved = graph.call_function(torch.ops.aten.permute_copy.default, (dq, [0, 2, 1]))
    q = graph.call_function(
        torch.ops.quantized_decomposed.quantize_per_tensor.default,
        (moved, 0.1, 0, -128, 127, torch.int8),
    )
    dq2 = graph.call_function(
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        (q, 0.1, 0, -128, 127, torch.int8),
    )
    last = graph.call_function(torch.ops.aten.relu.default, (dq2,))
    for node in (q, dq2, last):
        node.meta[TAG_KEY] = second_tag
    graph.output(last)
    module = GraphModule(torch.nn.Module(), graph)

    class Program:
        def __init__(self, gm: GraphModule) -> None:
            self.graph_module, self.graph = gm, gm.graph

    return Program(module), q


def test_a_moves_quantize_leaves_its_partition_unless_that_makes_a_cycle() -> None:
    """``DetagMovedQuantizes`` takes the quantize of an untagged ``dq -> permute`` out of the
    next partition; where that partition also made the permute's input (``P`` feeding itself
    through the outside nodes) the quantize stays."""
    from etkit_partition.policies import TAG_KEY

    program, q = _tagged_chain("Q")
    policy = DetagMovedQuantizes()
    assert policy.apply(program) == [q] and TAG_KEY not in q.meta
    assert integer_moves(program) == ["permute_copy_default"]  # type: ignore[arg-type]
    program, q = _tagged_chain("P")
    assert DetagMovedQuantizes().apply(program) == [] and q.meta[TAG_KEY] == "P"
