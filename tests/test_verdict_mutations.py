"""The verdict attacked: miscompilations injected into the program etkit writes (never into its
references, tests/verdict_mutations.py) on both targets, each checked to fire and to be caught;
the clean programs pass. Every mutation on every model and target: bench/verdict_mutations.py
(and `pytest -m extended` here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import verdict_mutations as vm  # beside this file: tests/ is on pytest's pythonpath

from etkit_exporter import export_model
from etkit_exporter.check.verdict import VerificationError
from etkit_exporter.export.demos import DEMOS, moving_scene

# In CI: four kinds per target, of four classes each (a coordinate bias under a pixel,
# truncation, one channel's weight scale, the output read a step up; a bias a step up, a grid
# shifted 0.13 pixel, the flow's components swapped, align_corners flipped)
CI = {
    "xnnpack": [
        "coordinate-bias-8-steps",
        "bias-truncation",
        "weight-scale-one-channel-10pct",
        "output-offset-one-step",
    ],
    "vgf": [
        "bias-one-step",
        "grid-shift-0.13px",
        "flow-components-swapped",
        "sampler-corners",
    ],
}


@pytest.fixture(scope="module", params=["xnnpack", "vgf"])
def clean(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    target = request.param
    model, inputs = DEMOS["flow-warp"]()
    seen, error = vm.export_verified(model, inputs, tmp_path_factory.mktemp(target) / "c", target)
    return target, model, inputs, seen, error


def test_the_clean_program_passes(clean: Any) -> None:
    _target, _model, _inputs, seen, error = clean
    assert error is None, error
    assert seen["verdict"]["result"] == "pass"


def _check(outcome: Any) -> None:
    assert outcome.applied is not None, f"{outcome.mutation} does not apply to the model"
    assert outcome.error is None, outcome.error
    assert outcome.references_unchanged, "a mutation touched the references"
    assert outcome.fired, f"{outcome.mutation} ({outcome.applied}) did not change the program"
    assert outcome.caught, (outcome.mutation, outcome.size, outcome.bias, outcome.reasons)


@pytest.mark.parametrize("index", range(4))
def test_a_miscompilation_is_caught(clean: Any, index: int, tmp_path: Path) -> None:
    target, model, inputs, seen, _ = clean
    name = CI[target][index]
    outcome = vm.run_mutation(name, model, inputs, seen, tmp_path / name, target)
    _check(outcome)
    if index == 0:  # a failed verdict localizes: the same rows and divergence as before
        _same_as_before(outcome, model, inputs, tmp_path / (name + ".failed-verification"),
                        target, tmp_path)  # fmt: skip


def _same_as_before(
    outcome: Any, model: Any, inputs: Any, kept: Path, target: str, scratch: Path
) -> None:
    """The failed verification (coordinates, localization and all) is the one the verdict
    gave before it ran in bounded memory (tests/verdict_oracle.py), figure for figure."""
    import shutil

    import verdict_oracle

    old = verdict_oracle.load(scratch / "oracle")
    folder = scratch / "copy"
    shutil.copytree(kept, folder)
    seen = outcome.seen
    before = old.verify_export(
        folder, model, seen["quantized_model"], inputs, seen["io"], target
    ).verification
    assert before["verdict"]["result"] == "fail" and before["verdict"]["divergence"]
    new, was = (verdict_oracle.comparable(v) for v in (seen["verification"], before))
    assert verdict_oracle.first_difference(new, was) is None


@pytest.mark.extended
@pytest.mark.parametrize("name", sorted(vm.MUTATIONS))
def test_every_miscompilation_above_the_envelope_is_caught(
    clean: Any, name: str, tmp_path: Path
) -> None:
    target, model, inputs, seen, _ = clean
    outcome = vm.run_mutation(name, model, inputs, seen, tmp_path / name, target)
    if outcome.applied is None or not outcome.fired:
        pytest.skip(f"{name} does not change this program ({outcome.applied})")
    if outcome.size <= 1 and outcome.bias <= 1:
        pytest.skip(f"{name} is within the rounding envelope (power {outcome.size:.3g} x bound)")
    _check(outcome)


def test_the_history_warp_shifted_a_quarter_pixel_fails(tmp_path: Path) -> None:
    """A program mutation in the recurrent path (the history's warp grid shifted 1/4 pixel
    before its quantize), injected into the edge program: the verdict fails it."""
    model, inputs = DEMOS["temporal-accumulator"]()
    fired: list[str] = []
    with vm.mutated(vm.grid_math("shift", 0.25), fired), pytest.raises(VerificationError) as caught:
        export_model(
            model, inputs, artifacts_root=tmp_path / "out", target="xnnpack",
            calibration=moving_scene(4, 32, 48), verify=True, loop_frames=8,
        )  # fmt: skip
    assert fired and fired[0].startswith("grid shift")
    message = str(caught.value)  # frame 0's outputs, or the loop from its first failing frame
    assert message.startswith("verification failed")
    assert "output 0 vs the quantized PT2E model" in message or "the loop: from frame" in message


def _clamp_caught(clean: Any, tmp_path: Path) -> None:
    target, model, inputs, seen, _ = clean
    outcome = vm.run_mutation("output-clamp-124", model, inputs, seen, tmp_path / "m", target)
    _check(outcome)
    assert any("top band" in reason for reason in outcome.reasons), outcome.reasons


def test_an_output_clamp_three_steps_narrower_is_caught_by_the_band_rule(
    clean: Any, tmp_path: Path
) -> None:
    """The attack issue 54 names: the flow-warp demo's output clamped at +-124 instead of +-127
    steps (71 saturated values pulled in by 3 steps) passed the power and bias rules; the top
    value band's bias bound fails it (XNNPACK here; VGF on demand, below: -2.79 steps against a
    bound of 0.198 when measured)."""
    if clean[0] == "vgf":
        pytest.skip("VGF: test_an_output_clamp_is_caught_on_vgf (-m extended)")
    _clamp_caught(clean, tmp_path)


@pytest.mark.extended
def test_an_output_clamp_is_caught_on_vgf(clean: Any, tmp_path: Path) -> None:
    if clean[0] != "vgf":
        pytest.skip("XNNPACK: the test above, in CI")
    _clamp_caught(clean, tmp_path)
