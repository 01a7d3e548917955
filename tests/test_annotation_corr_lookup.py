"""A RAFT-style correlation lookup (one encoder on both frames, all-pairs volume, a 2-level
pyramid sampled at coords + flow + a window, grids reaching past [-1, 1]) exports through
``export_model`` for VGF and for XNNPACK, and so do features warped and concatenated with
themselves; the XNNPACK programs run in executorch.runtime and compute what the quantized PT2E
model computes.

Before the fix XNNPACK could not load them (error 0x1): "Failed to create convolution node ...
xnn_status_invalid_parameter" (XNNPACK's quantizer annotates only the first op reading a
shared weight; the second stayed float beside it, sharing its bias), "Failed to create cat2/
squeeze node" (a grid sampler's output concatenated, or reshaped, with parameters of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from quant_models import CorrelationLookup, WarpConcatFeatures

from etkit_exporter import export_model

QUANTIZED_PSNR_DB = 40.0


def _psnr(verification: dict[str, Any] | None, reference: str) -> list[float]:
    assert verification is not None
    return [
        float("inf") if c["psnr_db"] is None else c["psnr_db"]
        for c in verification["comparisons"]
        if c["reference"] == reference
    ]


def _inputs(count: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.rand(1, 3, 16, 16) * 2 - 1 for _ in range(count))


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    # VGF on demand (-m extended), for CI time: 42 s for this export alone (not verified). A
    # RAFT-style lookup lowered to VGF is then checked on demand only (with RAFT-small, zoo)
    [pytest.param("vgf", marks=pytest.mark.extended), "xnnpack"],
)
def test_correlation_lookup_exports(tmp_path: Path, target: str) -> None:
    torch.manual_seed(0)
    result = export_model(
        CorrelationLookup(),
        _inputs(2),
        artifacts_root=tmp_path / "export",
        target=target,
        verify=target == "xnnpack",
    )
    assert result.pte_path.is_file()
    if target == "xnnpack":
        psnr = _psnr(result.verification, "quantized PT2E model")
        assert len(psnr) == 2 and min(psnr) >= QUANTIZED_PSNR_DB, result.verification


@pytest.mark.slow
def test_warped_features_concatenated_run_on_xnnpack(tmp_path: Path) -> None:
    torch.manual_seed(0)
    result = export_model(
        WarpConcatFeatures(),
        _inputs(1),
        artifacts_root=tmp_path / "export",
        target="xnnpack",
        verify=True,
    )
    assert min(_psnr(result.verification, "quantized PT2E model")) >= QUANTIZED_PSNR_DB
