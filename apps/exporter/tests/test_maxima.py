"""``channel_maxima_last``: maxima over channels (``amax``, ``torch.max(x, dim=1).values``) are
taken over the last dimension of a permuted view for XNNPACK: exact on the float model, and the
maximum exports inside XNNPACK's delegate (ExecuTorch 1.5.1 stopped at "amax.default only
supports dim == 2 or dim == 3")."""

from __future__ import annotations

import operator
from pathlib import Path

import torch

from etkit_exporter import export_model
from etkit_exporter.export.maxima import channel_maxima_last


class ChannelMaxima(torch.nn.Module):
    """The Model Gym's Karis tonemap (``x / (1 + max over channels)``), an ``amax`` over
    channels of a difference (NSS's colour/history difference) and one over width, after a
    conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        tonemapped = y / (1.0 + torch.max(y.abs(), dim=1, keepdim=True).values)
        difference = torch.amax(torch.abs(tonemapped - x), dim=1, keepdim=True)
        return tonemapped, difference + torch.amax(difference, dim=3, keepdim=True)


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, 6, 8, generator=torch.Generator().manual_seed(7)),)


def test_maxima_over_channels_become_maxima_over_the_last_dim_exactly() -> None:
    torch.manual_seed(0)
    model = ChannelMaxima().eval()
    graph = torch.export.export(model, _inputs(), strict=True).module(check_guards=False)
    rewritten = channel_maxima_last(graph)
    assert len(rewritten) == 3  # the max.dim and the amax over channels, the amax over width
    assert not [n for n in graph.graph.nodes if n.target == torch.ops.aten.amax.default]
    maxima = [n for n in graph.graph.nodes if n.target == torch.ops.aten.max.dim]
    assert [n.args[1:] for n in maxima] == [(3, True)] * 3
    permutes = [n for n in graph.graph.nodes if n.target == torch.ops.aten.permute.default]
    assert len(permutes) == 4  # over channels: there and back, twice
    assert all(u.target is operator.getitem for n in maxima for u in n.users)
    with torch.no_grad():
        want, got = model(*_inputs()), graph(*_inputs())
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)  # a maximum and copies: the same values


def test_indices_read_keep_the_maximum_as_it_is() -> None:
    class ArgMax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            values, indices = torch.max(x, dim=1, keepdim=True)
            return values + indices

    graph = torch.export.export(ArgMax(), _inputs(), strict=True).module(check_guards=False)
    assert channel_maxima_last(graph) == []


def test_the_maxima_export_inside_the_xnnpack_delegate(tmp_path: Path) -> None:
    torch.manual_seed(0)
    result = export_model(
        ChannelMaxima().eval(), _inputs(), artifacts_root=tmp_path / "maxima", target="xnnpack",
        verify=True,
    )  # fmt: skip
    assert result.verification is not None
    assert result.verification["verdict"]["result"] == "pass"
    outside = [o["op"] for o in result.report["outside_delegates"]]
    assert not [op for op in outside if "max" in op], outside
