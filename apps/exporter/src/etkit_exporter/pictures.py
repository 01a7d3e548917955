"""Verification pictures: for an image-like output, the float model's output, the exported
program's output and their error as a heatmap with its scale, side by side, with the PSNR in the
caption. People look at these; report.md embeds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

_GAP = 4
_CAPTION = 28
_MIN_SIDE = 128  # small outputs are enlarged (nearest) so that a reader can see pixels


def is_image_like(value: torch.Tensor) -> bool:
    """A 4-D output with 1, 3 or 4 channels: an image a person can look at."""
    return value.dim() == 4 and value.shape[1] in (1, 3, 4)


def _to_rgb(image: torch.Tensor, low: float, high: float) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """C x H x W in [low, high] -> H x W x 3 uint8 (grey repeated; alpha dropped)."""
    scaled = ((image.double() - low) / max(high - low, 1e-12) * 255).round().clamp(0, 255)
    pixels = scaled.to(torch.uint8).permute(1, 2, 0).numpy()
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels[:, :, :3]


def _heatmap(error: torch.Tensor, scale: float) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """H x W absolute error -> black (0) through red to yellow (``scale`` and above)."""
    t = (error.double() / max(scale, 1e-12)).clamp(0, 1).numpy()
    red = np.clip(t * 2, 0, 1)
    green = np.clip(t * 2 - 1, 0, 1)
    return (np.stack([red, green, np.zeros_like(t)], axis=2) * 255).astype(np.uint8)


def write_panel(
    path: Path,
    reference: torch.Tensor,
    actual: torch.Tensor,
    caption: str,
) -> None:
    """Writes a PNG: ``reference`` (the float model), ``actual`` (the program), and the
    per-pixel max-over-channels absolute error as a heatmap scaled to its own maximum, for
    batch item 0; ``caption`` and the heatmap's scale below."""
    from PIL import Image, ImageDraw

    ref, act = reference[0].float(), actual[0].float().reshape(reference[0].shape)
    low = float(min(ref.min(), act.min()))
    high = float(max(ref.max(), act.max()))
    error = (act - ref).abs().amax(dim=0)
    scale = float(error.max())
    tiles = [_to_rgb(ref, low, high), _to_rgb(act, low, high), _heatmap(error, scale)]
    height, width = tiles[0].shape[:2]
    zoom = max(1, -(-_MIN_SIDE // max(1, min(height, width))))
    tiles = [np.kron(t, np.ones((zoom, zoom, 1), dtype=np.uint8)) for t in tiles]
    height, width = height * zoom, width * zoom
    canvas = Image.new("RGB", (3 * width + 2 * _GAP, height + _CAPTION), "white")
    for k, tile in enumerate(tiles):
        canvas.paste(Image.fromarray(tile), (k * (width + _GAP), 0))
    draw = ImageDraw.Draw(canvas)
    draw.text((2, height + 2), caption, fill="black")
    draw.text(
        (2, height + 14),
        f"float model | exported program | |error| 0 (black) .. {scale:.4g} (yellow)",
        fill="black",
    )
    canvas.save(path)
