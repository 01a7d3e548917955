"""How close two tensors are: the figures verification, the verdict, bundles and ``etkit
inspect`` share."""

from __future__ import annotations

import math

import torch


def psnr(actual: torch.Tensor, reference: torch.Tensor) -> float | None:
    """Peak signal-to-noise ratio in dB, the peak being the reference's dynamic range
    (max - min; 2 for a full [-1, 1] image). ``None`` when the two are identical (infinite)."""
    mse = float(((actual.double() - reference.double()) ** 2).mean())
    peak = float(reference.max() - reference.min()) or 1.0
    return None if mse == 0 else 10 * math.log10(peak * peak / mse)


def within_tolerance(over: int, total: int, max_fraction: float) -> bool:
    """The rule ``etkit run model.bpte`` checks a bundle's outputs by (``check.bundle``): at
    most ``max_fraction`` of the ``total`` values are more than the tolerance off (``over``),
    and one value may always be, unless ``max_fraction`` is 0: a share of fewer values than
    ``1 / max_fraction`` is no share (two logits, one of them 3 steps off after a linear
    head amplified a pooled value's rounding: the fuzzer's seed 2302)."""
    allowed = max_fraction * total
    return total == 0 or over <= (max(allowed, 1.0) if max_fraction > 0 else 0)
