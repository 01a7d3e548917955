"""The sequence fuzz (issue 54): random recurrent models (``recurrent_fuzz``: a state through a
warp, a blend and a conv; 1 to 16 channels, odd sizes, batch 1 or 2, a buffer written in
forward or a state named with ``state=``, image, depth and logits outputs) exported with
``--verify``, their loop of 16 frames judged (VGF: 3 in CI, scenario_runner on lavapipe takes
about 6 s a frame). Each must export and pass its loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import recurrent_fuzz as rf  # beside this file: tests/ is on pytest's pythonpath
import torch

from etkit_exporter import export_model

CI_SEEDS = {"xnnpack": (1,), "vgf": ()}  # VGF: about 90 s a model (on demand)
ALL_SEEDS = range(8)


def test_the_generator_covers_the_class_and_is_deterministic() -> None:
    specs = [rf.generate(seed) for seed in range(40)]
    assert specs == [rf.generate(seed) for seed in range(40)]
    for field, values in (
        ("channels", {1, 3, 4, 16}), ("warp", {"predicted", "given", "affine"}),
        ("blend", {"fixed", "gated"}), ("output", {"state", "conv", "depth", "logits"}),
        ("form", {"buffer", "explicit"}), ("batch", {1, 2}),
    ):  # fmt: skip
        assert {getattr(s, field) for s in specs} == values, field
    for seed in range(12):
        model, inputs, _, frames = rf.build(rf.generate(seed), frames=3)
        with torch.no_grad():
            model(*inputs)
        assert len(frames) == 3


def _check(seed: int, target: str, out: Path, frames: int) -> None:
    spec = rf.generate(seed)
    model, inputs, state, sequence = rf.build(spec)
    result = export_model(
        model, inputs, artifacts_root=out, target=target, calibration=sequence[:8],
        state=state, verify=True, loop_frames=frames, verify_tolerance="samples=8",
    )  # fmt: skip
    loop = result.verification["loop"]
    assert loop["result"] == "pass" and loop["frames"] == frames, (spec, loop["first_failure"])
    (pair,) = result.io_quant_params["state"]
    entries = (
        result.io_quant_params["inputs"][pair["input_index"]],
        result.io_quant_params["outputs"][pair["output_index"]],
    )
    assert entries[0]["scale"] == entries[1]["scale"], spec


@pytest.mark.parametrize(
    ("target", "seed"), [(t, s) for t, seeds in CI_SEEDS.items() for s in seeds]
)
def test_a_random_recurrent_model_passes_its_loop(target: str, seed: int, tmp_path: Path) -> None:
    _check(seed, target, tmp_path / "out", 16 if target == "xnnpack" else 3)


@pytest.mark.extended
@pytest.mark.parametrize("target", ["xnnpack", "vgf"])
@pytest.mark.parametrize("seed", ALL_SEEDS)
def test_every_random_recurrent_model_passes_16_frames(
    target: str, seed: int, tmp_path: Path
) -> None:
    _check(seed, target, tmp_path / "out", 16)
