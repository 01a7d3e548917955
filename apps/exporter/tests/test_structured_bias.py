"""The structured bias rule (``check.judgement``): per output channel, value band and border
ring, each bounded by the envelope runs' means there plus the envelope's own standard errors."""

from __future__ import annotations

import torch

from etkit_exporter.check.judgement import judge_tensor, run_figures, structured_regions
from etkit_exporter.check.tolerance import DEFAULT_TOLERANCE

ENTRY = {"scale": 1 / 127, "zero_point": 0, "quant_min": -127, "quant_max": 127}


def _steps(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x * 127).clamp(-127, 127) / 127


def _setting(seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A 1x3x24x32 SNORM8 reference that saturates at both ends, and 16 envelope runs that
    differ from it by legitimate +-1 step roundings on 5 % of values."""
    generator = torch.Generator().manual_seed(seed)
    reference = _steps(torch.randn(1, 3, 24, 32, generator=generator) * 0.8)
    runs = []
    for _ in range(16):
        flips = (torch.rand(reference.shape, generator=generator) < 0.05).double()
        sign = torch.where(torch.rand(reference.shape, generator=generator) < 0.5, -1.0, 1.0)
        runs.append(_steps(reference + flips * sign / 127))
    return reference, runs


def test_the_regions_of_an_image_output() -> None:
    reference, _ = _setting()
    names = [r.name for r in structured_regions(reference, ENTRY)]
    assert names == [
        "channel 0",
        "channel 1",
        "channel 2",
        "top band",
        "bottom band",
        "border ring",
    ]
    ring = structured_regions(reference, ENTRY)[-1]
    assert ring.size == 3 * (24 * 32 - 20 * 28)
    # logits (N x 10): no ring, no channel of 1 value; a small output has no region at all
    assert structured_regions(torch.randn(1, 10), {"scale": None}) == []


def _judge(program: torch.Tensor, reference: torch.Tensor, runs: list[torch.Tensor]) -> dict:
    regions = structured_regions(reference, ENTRY)
    unit = ENTRY["scale"]
    figures = [run_figures(r, reference, unit, regions, reference.shape) for r in runs]
    return judge_tensor(
        program, reference, unit, DEFAULT_TOLERANCE, envelope=figures, regions=regions
    )


def test_a_program_like_an_envelope_run_passes_and_a_narrowed_clamp_fails() -> None:
    reference, runs = _setting()
    legit = _judge(runs[3], reference, runs[:3] + runs[4:])
    assert legit["passes"], legit.get("reasons")
    clamped = torch.clamp(runs[3], -124 / 127, 124 / 127)  # 3 steps narrower at both ends
    judged = _judge(clamped, reference, runs[:3] + runs[4:])
    assert not judged["passes"]
    assert any("top band" in r for r in judged["reasons"])
    assert any("bottom band" in r for r in judged["reasons"])


def test_a_bias_in_one_channel_or_the_border_fails() -> None:
    reference, runs = _setting()
    one_channel = runs[0].clone()
    one_channel[:, 1] += 0.6 / 127 * (torch.rand(one_channel[:, 1].shape) < 0.5)
    judged = _judge(_steps(one_channel), reference, runs[1:])
    assert any("channel 1" in r for r in judged.get("reasons", [])), judged.get("reasons")
    border = runs[0].clone()
    border[..., :2, :] += 1 / 127
    judged = _judge(_steps(border), reference, runs[1:])
    assert any("border ring" in r for r in judged.get("reasons", [])), judged.get("reasons")
