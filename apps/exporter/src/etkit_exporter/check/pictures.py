"""Verification pictures: for an image-like output, the float model's output, the quantized
model's, the exported program's, and the program's error against each as a heatmap on one
scale, side by side, with the figures in the caption. People look at these; report.md embeds
them.

The heatmaps' scale is in output steps (one step: the output's quantization scale) and starts
at a few steps, so that the rounding noise every integer program has (1 step, here and there)
reads as noise, not as a fault; a larger error stretches the scale and the caption says how
far."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

_GAP: Final = 4
_LINE: Final = 16  # caption line height, pixels
_FONT_SIZE: Final = 12
WORD_GAP: Final = 4  # pixels between words: the font's own space (3 px) runs them together
_MIN_SIDE: Final = 128  # small outputs are enlarged (nearest) so that a reader can see pixels
MIN_SCALE_STEPS: Final = 4  # the heatmaps reach yellow at this many steps, or at the largest error


def is_image_like(value: torch.Tensor) -> bool:
    """A 4-D output with 1, 3 or 4 channels: an image a person can look at."""
    return value.dim() == 4 and value.shape[1] in (1, 3, 4)


def _to_rgb(image: torch.Tensor, low: float, high: float) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """C x H x W in [low, high] -> H x W x 3 uint8 (grey repeated; alpha dropped)."""
    scaled = ((image.double() - low) / max(high - low, 1e-12) * 255).round().clamp(0, 255)
    pixels = scaled.to(torch.uint8).permute(1, 2, 0).numpy()
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels[:, :, :3]


def _heatmap(error: torch.Tensor, scale: float) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """H x W absolute error -> black (0) through red (``scale`` / 2) to yellow (``scale`` and
    above)."""
    t = (error.double() / max(scale, 1e-12)).clamp(0, 1).numpy()
    red = np.clip(t * 2, 0, 1)
    green = np.clip(t * 2 - 1, 0, 1)
    return (np.stack([red, green, np.zeros_like(t)], axis=2) * 255).round().astype(np.uint8)


def heatmap_scale(largest: float, step: float | None) -> float:
    """The error at which the heatmaps turn yellow: with ``step`` (the output's quantization
    scale), ``MIN_SCALE_STEPS`` steps or the ``largest`` error rounded up to whole steps,
    whichever is more; without, the largest error (a float output has no step)."""
    if step is None or step <= 0:
        return largest
    return max(MIN_SCALE_STEPS, math.ceil(largest / step - 1e-9)) * step


def _font(size: int) -> Any:
    """Pillow's own scalable font (the same on every machine); its bitmap font without
    FreeType."""

    try:
        return ImageFont.load_default(size=size)
    except (OSError, TypeError, ValueError):
        return ImageFont.load_default()


def word_positions(text: str, font: Any) -> list[tuple[str, float]]:
    """Each word of ``text`` and the x offset it is drawn at: ``WORD_GAP`` pixels after the
    previous word."""

    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    placed, x = [], 0.0
    for word in text.split():
        placed.append((word, x))
        x += measure.textlength(word, font=font) + WORD_GAP
    return placed


def _draw_text(draw: Any, left: float, top: float, text: str, font: Any) -> None:
    for word, x in word_positions(text, font):
        draw.text((left + x, top), word, fill="black", font=font)


def write_panel(
    path: Path,
    reference: torch.Tensor,
    actual: torch.Tensor,
    caption: str,
    *,
    quantized: torch.Tensor | None = None,
    step: float | None = None,
) -> None:
    """Writes a PNG for batch item 0: ``reference`` (the float model), ``quantized`` (the
    quantized model, if given), ``actual`` (the program), and the per-pixel max-over-channels
    absolute error of the program against each model as heatmaps on one scale
    (``heatmap_scale``: in steps of ``step``, the output's quantization scale, when given);
    ``caption`` and the scale below, each tile labelled."""

    shape = reference[0].shape
    ref, act = reference[0].float(), actual[0].float().reshape(shape)
    images = [("float model", ref)]
    if quantized is not None:
        images.append(("quantized model", quantized[0].float().reshape(shape)))
    images.append(("exported program", act))
    low = float(min(float(image.min()) for _, image in images))
    high = float(max(float(image.max()) for _, image in images))
    errors = [("error vs float", (act - ref).abs().amax(dim=0))]
    if quantized is not None:
        errors.append(("error vs quantized", (act - images[1][1]).abs().amax(dim=0)))
    largest = max(float(error.max()) for _, error in errors)
    scale = heatmap_scale(largest, step)
    tiles = [(label, _to_rgb(image, low, high)) for label, image in images]
    tiles += [(label, _heatmap(error, scale)) for label, error in errors]

    height, width = tiles[0][1].shape[:2]
    zoom = max(1, -(-_MIN_SIDE // max(1, min(height, width))))
    height, width = height * zoom, width * zoom
    lines = [caption, *_scale_lines(errors, scale, step)]
    canvas = Image.new(
        "RGB",
        (len(tiles) * width + (len(tiles) - 1) * _GAP, height + _LINE * (len(lines) + 1) + 4),
        "white",
    )
    draw = ImageDraw.Draw(canvas)
    font = _font(_FONT_SIZE)
    for k, (label, tile) in enumerate(tiles):
        left = k * (width + _GAP)
        canvas.paste(Image.fromarray(np.kron(tile, np.ones((zoom, zoom, 1), np.uint8))), (left, 0))
        _draw_text(draw, left + 2, height + 2, label, font)
    for k, line in enumerate(lines, start=1):
        _draw_text(draw, 2, height + 2 + k * _LINE, line, font)
    canvas.save(path)


def _scale_lines(
    errors: list[tuple[str, torch.Tensor]], scale: float, step: float | None
) -> list[str]:
    """The caption lines that read the heatmaps: their scale and each one's largest error."""
    if step is None or step <= 0:
        largest = ", ".join(f"{label} max {float(e.max()):.4g}" for label, e in errors)
        return [f"heatmaps |error|: black 0, yellow {scale:.4g} ({largest})"]
    steps = round(scale / step)
    largest = ", ".join(f"{label} max {float(e.max()) / step:.3g} steps" for label, e in errors)
    return [
        f"heatmaps |error| in output steps (1 step = {step:.4g}): black 0, red {steps / 2:g}, "
        f"yellow {steps} or more",
        largest,
    ]
