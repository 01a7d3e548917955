"""``DetagQuantizeDtypes`` on a real exported graph with int8 and int16 quantize/dequantize."""

from __future__ import annotations

import pytest
import torch

from etkit_partition import DetagQuantizeDtypes
from etkit_partition.policies import TAG_KEY

Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default


class Mixed(torch.nn.Module):
    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        g = DQ(Q(grid, 1 / 32767, 0, -32767, 32767, torch.int16), 1 / 32767, 0, -32767, 32767,
               torch.int16)  # fmt: skip
        i = DQ(Q(image, 1 / 127, 0, -127, 127, torch.int8), 1 / 127, 0, -127, 127, torch.int8)
        return g * 1.5 + i


def test_int16_nodes_and_their_readers_leave_int8_ones_tagged() -> None:
    program = torch.export.export(Mixed(), (torch.rand(1, 4, 4, 2), torch.rand(1, 4, 4, 2)))
    for node in program.graph.nodes:
        if node.op == "call_function":
            node.meta[TAG_KEY] = "tag0"
    detagged = DetagQuantizeDtypes([torch.int16]).apply(program)
    names = {n.name for n in detagged}
    dtypes = {n.name: n.args[5] for n in program.graph.nodes if n.target in (Q, DQ)}
    assert {n for n, d in dtypes.items() if d == torch.int16} < names
    assert any(n.target == torch.ops.aten.mul.Tensor for n in detagged)  # reads int16 DQ
    still = {n.name for n in program.graph.nodes if n.meta.get(TAG_KEY)}
    assert {n for n, d in dtypes.items() if d == torch.int8} <= still


def test_needs_dtypes() -> None:
    with pytest.raises(TypeError, match="one or more torch dtypes"):
        DetagQuantizeDtypes([])
