"""``xnnpack_patterns_only_where_they_match``: two XNNPACK preprocess passes skip pattern matching
that cannot change the graph (their pattern graphs cost about 6 s of every new process's first
XNNPACK export), and the program is the same bytes with and without it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import (
    ConvertToUpsampleBilinear2d,
)
from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
from executorch.exir.dialects._ops import ops as exir_ops

from etkit_exporter import export_model
from etkit_exporter.export import lowering
from etkit_exporter.export.lowering import SDPA_PATTERN_OP, xnnpack_patterns_only_where_they_match


def _ops(graph_module: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
def test_the_skipped_matching_could_not_have_changed_a_graph() -> None:
    """The facts the skip rests on, read from the installed ExecuTorch's own pattern graphs:
    when an upgrade changes them, this fails and the skip must be looked at again."""
    bilinear_patterns = bilinear_2d.get_graphs()
    assert bilinear_patterns
    for pattern in bilinear_patterns:  # one op, which the pass leaves as it is when matched
        assert _ops(pattern) == [exir_ops.edge.aten.upsample_bilinear2d.vec]
    sdpa_patterns = sdpa.get_graphs()
    assert sdpa_patterns
    for pattern in sdpa_patterns:
        assert SDPA_PATTERN_OP in _ops(pattern)


def test_upstreams_passes_are_back_after_the_block_even_when_it_raises() -> None:
    calls = ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call
    with pytest.raises(RuntimeError), xnnpack_patterns_only_where_they_match():
        with xnnpack_patterns_only_where_they_match():  # re-entrant
            pass
        assert (ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call) != calls
        raise RuntimeError("a failing stage")
    assert (ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call) == calls


class _Upsampled(torch.nn.Module):
    """A bilinear upsample (XNNPACK's bilinear pass sees it), a softmax over channels (its SDPA
    pass matches, as upstream does) and a grid sampler."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(self.conv(image), scale_factor=2, mode="bilinear")
        weights = torch.softmax(up, dim=1)
        return F.grid_sample(up * weights, grid, align_corners=False)


@pytest.mark.slow
def test_export_is_byte_identical_with_and_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _Upsampled().eval()
    generator = torch.Generator().manual_seed(1)
    inputs = (
        torch.rand(1, 3, 8, 12, generator=generator) * 2 - 1,
        torch.rand(1, 16, 24, 2, generator=generator) * 2 - 1,
    )
    skipped = export_model(model, inputs, artifacts_root=tmp_path / "skipped", target="xnnpack")
    monkeypatch.setattr(lowering, "xnnpack_patterns_only_where_they_match", contextlib.nullcontext)
    matched = export_model(model, inputs, artifacts_root=tmp_path / "matched", target="xnnpack")
    assert skipped.pte_path.read_bytes() == matched.pte_path.read_bytes()
