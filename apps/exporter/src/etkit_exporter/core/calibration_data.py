"""Calibration samples from files, for ``etkit-export --calibration PATH``.

``PATH`` is a folder, a file or a glob. Each sample is one of:

- an ``.npz`` file: one array per model input, by input name or, failing that, in the order of
  its arrays;
- a ``.pt`` file: a tensor (one-input models), or a tuple/list of tensors, or a dict by input name;
- a ``.npy`` or image file (``.png``, ``.jpg``, ``.jpeg``): one input's value; a one-input model
  takes each such file as a sample, a model with more inputs takes each sub-folder of ``PATH`` as
  a sample (its files, sorted by name, one per input).

Images are read as 1 x C x H x W float32 (C = 1 grey, 3 RGB, 4 RGBA) with pixel values mapped
linearly from [0, 255] to the stated ``image_range`` (e.g. (-1, 1) or (0, 1)). Every file is read
and checked before any work: a bad file, a shape or dtype that differs from the example input, an
image without a range, each names the file.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

# torch and PIL are imported in the functions that read samples: the commands check
# --image-range with parse_image_range before torch's 2.4 s import.

if TYPE_CHECKING:  # imported where used: parse_image_range serves commands before torch loads
    import torch

IMAGE_SUFFIXES: Final = (".png", ".jpg", ".jpeg")
ARRAY_SUFFIXES: Final = (".npy",)
SAMPLE_SUFFIXES: Final = (".npz", ".pt")
SUFFIXES: Final = IMAGE_SUFFIXES + ARRAY_SUFFIXES + SAMPLE_SUFFIXES


class CalibrationDataError(ValueError):
    """A calibration file or folder that cannot be used; the message names it."""


def parse_image_range(text: str) -> tuple[float, float]:
    """``"-1,1"`` -> ``(-1.0, 1.0)``; raises ``CalibrationDataError`` for anything else."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError as error:
        raise CalibrationDataError(
            f"bad image range '{text}': expected LOW,HIGH such as -1,1 or 0,1"
        ) from error
    if not low < high:
        raise CalibrationDataError(f"bad image range '{text}': LOW must be below HIGH")
    return low, high


def _files(path: str) -> list[Path]:
    given = Path(path)
    if given.is_dir():
        return sorted(p for p in given.iterdir() if p.suffix.lower() in SUFFIXES or p.is_dir())
    if given.is_file():
        return [given]
    matches = sorted(Path(p) for p in glob.glob(path))  # noqa: PTH207  (absolute patterns too)
    if not matches:
        raise CalibrationDataError(f"--calibration {path}: no such file, folder or glob match")
    return matches


def read_image(path: Path, image_range: tuple[float, float] | None) -> torch.Tensor:
    import torch
    from PIL import Image, UnidentifiedImageError

    if image_range is None:
        raise CalibrationDataError(
            f"{path} is an image: give --image-range LOW,HIGH (e.g. 0,1 or -1,1), the range the "
            "model expects pixel values in"
        )
    try:
        with Image.open(path) as image:
            mode = image.mode if image.mode in ("L", "RGB", "RGBA") else "RGBA"
            pixels = np.asarray(image.convert(mode), dtype=np.float32)
    except (OSError, UnidentifiedImageError) as error:
        raise CalibrationDataError(f"{path}: not a readable image ({error})") from error
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    low, high = image_range
    values = torch.from_numpy(pixels.copy()).permute(2, 0, 1).unsqueeze(0)
    return values * ((high - low) / 255.0) + low


def read_array(path: Path) -> torch.Tensor:
    import torch

    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise CalibrationDataError(f"{path}: not a readable .npy array ({error})") from error
    return torch.from_numpy(np.ascontiguousarray(array))


def _read_sample_file(path: Path, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    import torch

    if path.suffix.lower() == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
        except (OSError, ValueError) as error:
            raise CalibrationDataError(f"{path}: not a readable .npz archive ({error})") from error
        keys = list(names) if set(names) <= set(arrays) else list(arrays)
        return tuple(torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in keys)
    try:
        loaded: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CalibrationDataError(f"{path}: not a readable .pt file ({error})") from error
    if isinstance(loaded, torch.Tensor):
        return (loaded,)
    if isinstance(loaded, dict) and set(names) <= set(loaded):
        loaded = [loaded[name] for name in names]
    if isinstance(loaded, list | tuple) and all(isinstance(v, torch.Tensor) for v in loaded):
        return tuple(loaded)
    raise CalibrationDataError(
        f"{path}: holds a {type(loaded).__name__}; a .pt sample is a tensor, a tuple or list of "
        "tensors, or a dict by input name"
    )


def _read_one(path: Path, image_range: tuple[float, float] | None) -> torch.Tensor:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return read_image(path, image_range)
    if suffix in ARRAY_SUFFIXES:
        return read_array(path)
    raise CalibrationDataError(f"{path}: one input's value must be .npy or an image")


def _check(
    sample: tuple[torch.Tensor, ...],
    examples: tuple[torch.Tensor, ...],
    source: Path,
    any_size: bool = False,
) -> tuple[torch.Tensor, ...]:
    import torch

    if len(sample) != len(examples):
        raise CalibrationDataError(
            f"{source}: holds {len(sample)} inputs, the model takes {len(examples)}"
        )
    checked = []
    for k, (value, example) in enumerate(zip(sample, examples, strict=True)):
        if value.dtype == torch.float64 and example.dtype == torch.float32:
            value = value.float()  # numpy's default; the values fit
        shape, expected = tuple(value.shape), tuple(example.shape)
        if any_size and len(shape) == len(expected) >= 3:  # the export checks the size itself
            shape, expected = shape[:-2], expected[:-2]
        if shape != expected or value.dtype != example.dtype:
            raise CalibrationDataError(
                f"{source}: input {k} is {str(value.dtype).removeprefix('torch.')} "
                f"{'x'.join(map(str, value.shape))}, the example input is "
                f"{str(example.dtype).removeprefix('torch.')} "
                f"{'x'.join(map(str, example.shape))}"
            )
        checked.append(value)
    return tuple(checked)


def read_calibration(
    path: str,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    input_names: Sequence[str] = (),
    image_range: tuple[float, float] | None = None,
    on_file: Callable[[int, int], None] | None = None,
    any_size: bool = False,
) -> list[tuple[torch.Tensor, ...]]:
    """The samples at ``path`` (see the module docstring), each checked against
    ``example_inputs`` (``any_size``: an export of several sizes, whose own check takes a
    sample of any of its sizes, so the last two dimensions of inputs of rank 3 or more are
    not compared here). Raises ``CalibrationDataError`` naming the file at fault."""
    entries = _files(path)
    samples: list[tuple[torch.Tensor, ...]] = []
    for done, entry in enumerate(entries, start=1):
        if entry.is_dir():
            parts = sorted(p for p in entry.iterdir() if p.suffix.lower() in SUFFIXES)
            if len(parts) == 1 and parts[0].suffix.lower() in SAMPLE_SUFFIXES:
                sample = _read_sample_file(parts[0], input_names)
            else:
                sample = tuple(_read_one(p, image_range) for p in parts)
        elif entry.suffix.lower() in SAMPLE_SUFFIXES:
            sample = _read_sample_file(entry, input_names)
        elif len(example_inputs) == 1:
            sample = (_read_one(entry, image_range),)
        else:
            raise CalibrationDataError(
                f"{entry}: the model takes {len(example_inputs)} inputs; give each sample as a "
                "sub-folder (one file per input, sorted by name), an .npz or a .pt file"
            )
        samples.append(_check(sample, example_inputs, entry, any_size))
        if on_file is not None:
            on_file(done, len(entries))
    if not samples:
        raise CalibrationDataError(
            f"--calibration {path}: no samples found (files ending in {', '.join(SUFFIXES)})"
        )
    return samples
