"""Which way each grid sampler went, as the report and the console say it: the VGF's compute
segment, etkit's own delegate with the reason, or ExecuTorch's portable float kernel when
etkit's delegate refused it too (before, such a sampler was reported as in etkit's delegate
while it ran as the portable kernel)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from etkit_exporter.export.lowering import PORTABLE_KERNEL, sampler_paths
from etkit_gridsampler.vgf_shader import IN_VGF, OWN_DELEGATE
from etkit_gridsampler.vgf_shader.lowering import SamplerPath

BICUBIC = "interpolation mode 2 (bicubic) is not supported"


def test_sampler_etkits_delegate_refused_is_reported_as_the_portable_kernel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    partitioner = SimpleNamespace(
        paths=[
            SamplerPath("inside", IN_VGF),
            SamplerPath("odd", OWN_DELEGATE, "25 bytes: not a multiple of 4"),
            SamplerPath("cubic", OWN_DELEGATE, BICUBIC),
        ]
    )
    program = SimpleNamespace()  # not read for VGF: the partitioner's paths are
    with caplog.at_level(logging.WARNING):
        paths = sampler_paths(partitioner, program, [], "vgf", {"cubic": BICUBIC})  # type: ignore[arg-type]
    got = [(p["node"], p["path"], p["reason"]) for p in paths]
    assert got == [
        ("inside", IN_VGF, None),
        ("odd", OWN_DELEGATE, "25 bytes: not a multiple of 4"),
        ("cubic", PORTABLE_KERNEL, BICUBIC),
    ]
    warned = [r.getMessage() for r in caplog.records]
    assert any("odd stays outside the VGF, in etkit's own delegate" in w for w in warned)
    assert any("cubic is not delegated" in w and "portable float kernel" in w for w in warned)
    assert not any("cubic stays outside the VGF" in w for w in warned)
