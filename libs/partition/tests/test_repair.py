"""``repair_partitions`` and ``duplicate_dequantize`` on small tagged programs (no lowering):
where dequantize nodes and weights end up when a partition falls apart."""

from __future__ import annotations

import logging

import pytest
import torch
import torchao.quantization.pt2e  # noqa: F401  # registers the quantized_decomposed ops
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_partition import duplicate_dequantize, merge_partitions, repair_partitions

TAG = "delegation_tag"
Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default
QPARAMS = (0.1, 0, -128, 127, torch.int8)


class TwoConsumers(torch.nn.Module):
    """x -> quantize -> dequantize -> (relu, tanh)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dequantized = DQ(Q(x, *QPARAMS), *QPARAMS)
        return torch.relu(dequantized) * 2, torch.tanh(dequantized)


class AroundAnOutsideOp(torch.nn.Module):
    """relu -> sigmoid (kept outside) -> mul by a buffer: relu and mul in one partition would
    reach each other through the sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.relu(x)) * self.weight


def _program(model: torch.nn.Module) -> ExportedProgram:
    return torch.export.export(model, (torch.randn(4),), strict=True)


def _nodes(program: ExportedProgram) -> dict[str, Node]:
    return {n.name: n for n in program.graph.nodes}


def _tag(program: ExportedProgram, tags: dict[str, str]) -> None:
    nodes = _nodes(program)
    for name, tag in tags.items():
        nodes[name].meta[TAG] = tag


def _tags(program: ExportedProgram) -> dict[str, str | None]:
    return {n.name: n.meta.get(TAG) for n in program.graph.nodes}


def test_dequantize_goes_to_the_partition_of_its_consumers() -> None:
    program = _program(TwoConsumers())
    _tag(
        program,
        {
            "quantize_per_tensor": "a",
            "dequantize_per_tensor": "a",
            "relu": "a",
            "mul": "a",
            "tanh": "b",
        },
    )
    duplicate_dequantize(program)  # each consumer its own dequantize (one copy here)
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    (copy,) = [n for n in nodes if n.target == DQ and "tanh" in {u.name for u in n.users}]
    assert TAG in copy.meta  # the copy was made in partition a, with the original's tag
    tags = repair_partitions(program, {"a": "spec-a", "b": "spec-b"})
    assert tags == {"a": "spec-a", "b": "spec-b"}
    after = _tags(program)
    assert after[copy.name] == "b"  # moved to the partition of its consumer
    assert after["dequantize_per_tensor"] == after["relu"] == "a"


def test_dequantize_whose_consumers_are_outside_leaves_the_partition() -> None:
    program = _program(TwoConsumers())
    _tag(program, {"quantize_per_tensor": "a", "dequantize_per_tensor": "a", "relu": "a"})
    duplicate_dequantize(program)
    tags = repair_partitions(program, {"a": "spec"})
    after = _tags(program)
    to_tanh = next(n for n in _nodes(program)["tanh"].all_input_nodes)
    assert after[to_tanh.name] is None  # the delegate gives out integers; tanh reads them
    assert after["relu"] == "a" and tags == {"a": "spec"}


def test_dequantize_left_outside_by_a_policy_stays_outside() -> None:
    program = _program(TwoConsumers())
    duplicate_dequantize(program)
    _tag(program, {"relu": "a", "mul": "a"})
    repair_partitions(program, {"a": "spec"})
    relu_input = _nodes(program)["relu"].all_input_nodes[0]
    assert relu_input.meta.get(TAG) is None


def test_dequantize_feeding_two_partitions_is_named(caplog: pytest.LogCaptureFixture) -> None:
    program = _program(TwoConsumers())
    _tag(
        program,
        {"quantize_per_tensor": "a", "dequantize_per_tensor": "a", "relu": "b", "tanh": "c"},
    )
    with caplog.at_level(logging.WARNING, logger="etkit_partition"):
        repair_partitions(program, {"a": 0, "b": 1, "c": 2})
    assert "dequantize_per_tensor feeds several partitions (b, c)" in caplog.text
    assert "duplicate_dequantize" in caplog.text


def test_duplicate_dequantize_keeps_the_program_computing_the_same() -> None:
    program = _program(TwoConsumers())
    x = torch.randn(4)
    expected = program.module()(x)
    assert duplicate_dequantize(program) == 1
    assert duplicate_dequantize(program) == 0
    dequantizes = [n for n in program.graph.nodes if n.target == DQ]
    assert len(dequantizes) == 2 and all(len(n.users) == 1 for n in dequantizes)
    for got, want in zip(program.module()(x), expected, strict=True):
        assert torch.equal(got, want)


def test_weight_goes_with_the_op_that_reads_it_when_a_partition_is_split() -> None:
    program = _program(AroundAnOutsideOp())
    _tag(program, {"b_weight": "a", "relu": "a", "mul": "a"})  # the sigmoid stays outside
    tags = repair_partitions(program, {"a": "spec"})
    after = _tags(program)
    assert after["relu"] != after["mul"]  # one partition would form a cycle through sigmoid
    assert after["b_weight"] == after["mul"]  # not a partition of a lone weight
    assert set(tags) == {after["relu"], after["mul"]}


class SharingOnlyInputs(torch.nn.Module):
    """relu(x) and tanh(x), then a sigmoid of the relu (kept outside) times the tanh: relu and
    tanh share only the input; tanh and the mul are joined by an edge."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        relu = torch.relu(x)
        return relu, torch.sigmoid(relu) * torch.tanh(x)


def test_partitions_sharing_only_inputs_are_merged_into_one() -> None:
    program = _program(SharingOnlyInputs())
    _tag(program, {"relu": "a", "tanh": "b", "mul": "c"})
    tags = merge_partitions(program, {"a": "vgf", "b": "vgf", "c": "vgf"})
    after = _tags(program)
    # relu and tanh join (no path between them); mul cannot join relu's partition: relu ->
    # sigmoid (outside) -> mul would be a cycle
    assert after["relu"] == after["tanh"] == "a"
    assert after["mul"] == "c"
    assert tags == {"a": "vgf", "c": "vgf"}


def test_partitions_of_different_backends_are_not_merged() -> None:
    program = _program(SharingOnlyInputs())
    _tag(program, {"relu": "a", "tanh": "b"})
    tags = merge_partitions(program, {"a": "vgf", "b": "xnnpack"})
    assert tags == {"a": "vgf", "b": "xnnpack"}
    after = _tags(program)
    assert (after["relu"], after["tanh"]) == ("a", "b")
