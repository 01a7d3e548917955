"""The verification pictures: the heatmaps read in output steps on one scale that starts at a
few steps (rounding noise reads as noise), the quantized model beside the float one, and
captions whose words stand apart."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from etkit_exporter.check.pictures import (
    MIN_SCALE_STEPS,
    WORD_GAP,
    _font,
    heatmap_scale,
    word_positions,
    write_panel,
)

STEP = 1 / 127


def _tiles(path: Path, count: int) -> list[np.ndarray]:
    """The tiles of a panel (each as wide as it is: the outputs here are square)."""
    with Image.open(path) as picture:
        pixels = np.asarray(picture.convert("RGB"))
    side = (pixels.shape[1] - 4 * (count - 1)) // count
    return [pixels[:side, k * (side + 4) : k * (side + 4) + side] for k in range(count)]


def test_one_step_of_noise_is_dim_not_alarming(tmp_path: Path) -> None:
    """A program one step off the quantized model everywhere: the heatmap against the quantized
    model is a quarter of its scale (dim red), not its own maximum (yellow)."""
    torch.manual_seed(0)
    reference = torch.rand(1, 3, 32, 32) * 2 - 1
    quantized = (reference / STEP).round() * STEP
    program = quantized + STEP
    write_panel(tmp_path / "p.png", reference, program, "caption", quantized=quantized, step=STEP)
    tiles = _tiles(tmp_path / "p.png", 5)  # float, quantized, program, two heatmaps
    against_quantized = tiles[4].reshape(-1, 3)
    expected = 255 * 2 / MIN_SCALE_STEPS  # red ramps to full at half the scale
    assert (np.abs(against_quantized[:, 0] - expected) <= 1).all()  # float32 rounding
    assert (against_quantized[:, 1:] == 0).all()
    # without the quantized model and the step (a float output): scaled to the largest error
    write_panel(tmp_path / "f.png", reference, program, "caption")
    assert (_tiles(tmp_path / "f.png", 3)[2] == [255, 255, 0]).all(axis=2).any()


@pytest.mark.parametrize(
    ("largest_steps", "scale_steps"), [(0.0, 4), (1.0, 4), (4.0, 4), (6.5, 7), (30.0, 30)]
)
def test_heatmap_scale_is_whole_steps_from_a_floor(largest_steps: float, scale_steps: int) -> None:
    assert heatmap_scale(largest_steps * STEP, STEP) == pytest.approx(scale_steps * STEP)


def test_caption_words_stand_apart() -> None:
    font = _font(12)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    placed = word_positions("PSNR 52.30 dB, max abs error 0.0183", font)
    assert [word for word, _ in placed] == ["PSNR", "52.30", "dB,", "max", "abs", "error", "0.0183"]
    for (word, x), (_, next_x) in itertools.pairwise(placed):
        assert next_x - (x + measure.textlength(word, font=font)) == WORD_GAP
    assert measure.textlength(" ", font=font) < WORD_GAP  # the font's own space is narrower
