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


class _Program:
    """What ``integer_moves`` and the policy read of an ``ExportedProgram``."""

    def __init__(self, module: Any) -> None:
        self.graph_module, self.graph = module, module.graph


def _permuted(source_tag: str | None, scale: float) -> tuple[Any, dict[str, Any]]:
    """x -> [source_tag: relu] -> dq (0.1) -> permute -> q (``scale``) -> dq -> relu -> output;
    returns the program and its nodes by role (tag them as a test needs)."""
    from torch.fx import Graph, GraphModule

    from etkit_partition.policies import TAG_KEY

    qd = torch.ops.quantized_decomposed
    graph = Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.aten.relu.default, (x,))
    if source_tag is not None:
        first.meta[TAG_KEY] = source_tag
    dq = graph.call_function(
        qd.dequantize_per_tensor.default, (first, 0.1, 0, -128, 127, torch.int8)
    )
    moved = graph.call_function(torch.ops.aten.permute_copy.default, (dq, [0, 2, 1]))
    q = graph.call_function(
        qd.quantize_per_tensor.default, (moved, scale, 0, -128, 127, torch.int8)
    )
    q.meta["val"] = torch.empty(1, 3, 2, dtype=torch.int8)
    dq2 = graph.call_function(
        qd.dequantize_per_tensor.default, (q, scale, 0, -128, 127, torch.int8)
    )
    last = graph.call_function(torch.ops.aten.relu.default, (dq2,))
    graph.output(last)
    nodes = {"first": first, "moved": moved, "q": q, "dq2": dq2, "last": last}
    return _Program(GraphModule(torch.nn.Module(), graph)), nodes


def test_only_equal_parameters_are_rewritten() -> None:
    """A move whose quantize has other parameters than its dequantize is left as it is."""
    program, nodes = _permuted(None, 0.2)
    assert integer_moves(program) == []
    program, nodes = _permuted(None, 0.1)
    assert integer_moves(program) == [nodes["moved"].name]
    assert nodes["moved"].args[0] is nodes["first"] and nodes["dq2"].args[0] is nodes["moved"]


def _tagged_chain(second_tag: str) -> tuple[Any, Any]:
    """``_permuted`` with the first relu in partition P, and q -> dq -> relu in
    ``second_tag``."""
    from etkit_partition.policies import TAG_KEY

    program, nodes = _permuted("P", 0.1)
    for role in ("q", "dq2", "last"):
        nodes[role].meta[TAG_KEY] = second_tag
    return program, nodes["q"]


def test_a_moves_quantize_leaves_its_partition_unless_that_makes_a_cycle() -> None:
    """``DetagMovedQuantizes`` takes the quantize of an untagged ``dq -> permute`` out of the
    next partition; where that partition also made the permute's input (``P`` feeding itself
    through the outside nodes) the quantize stays."""
    from etkit_partition.policies import TAG_KEY

    program, q = _tagged_chain("Q")
    policy = DetagMovedQuantizes()
    assert policy.apply(program) == [q] and TAG_KEY not in q.meta
    assert integer_moves(program) == ["permute_copy_default"]
    program, q = _tagged_chain("P")
    assert DetagMovedQuantizes().apply(program) == [] and q.meta[TAG_KEY] == "P"
