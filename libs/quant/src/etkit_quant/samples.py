"""Calibration samples checked before any work (``check_calibration``): each a tuple of finite
tensors with the example inputs' count, shapes and dtypes, the error naming the sample and the
input."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

OnSample = Callable[[int, int], None]
"""Progress callback: ``on_sample(done, total)`` after each calibration sample (``done`` runs
from 1 to ``total``)."""

ReferenceFor = Callable[[int, tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]
"""``reference_for(index, sample)``: the inputs calibration sample ``index`` must match (its
count, shapes and dtypes), for samples that may come in several sizes; raises ``ValueError``
naming the sample when its size is not one the model is exported for."""


def _describe_shape(shape: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _same_shape(value: Sequence[int], expected: Sequence[object]) -> bool:
    """``value`` has ``expected``'s rank and size in every dimension ``expected`` fixes (a
    symbolic dimension of a graph captured with dynamic shapes takes any size)."""
    return len(value) == len(expected) and all(
        v == e for v, e in zip(value, expected, strict=True) if isinstance(e, int)
    )


def _check_sample(
    sample: object, reference: Sequence[torch.Tensor] | None, what: str
) -> tuple[torch.Tensor, ...]:
    """``sample`` as a tuple of finite tensors matching ``reference`` (count, shapes, dtypes;
    any tensors when ``None``). ``what`` names the sample in errors."""
    if not isinstance(sample, tuple):
        raise TypeError(
            f"{what} must be a tuple of tensors (one per model input), got {type(sample).__name__}"
        )
    if reference is not None and len(sample) != len(reference):
        raise ValueError(
            f"{what} has {len(sample)} inputs, but the model takes {len(reference)} (the example "
            "inputs)"
        )
    for k, value in enumerate(sample):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}, input {k} must be a torch.Tensor, got {type(value).__name__}")
        if reference is None:
            continue
        expected = reference[k]
        if not _same_shape(tuple(value.shape), tuple(expected.shape)):
            raise ValueError(
                f"{what}, input {k} has shape {_describe_shape(value.shape)}, but the example "
                f"input has {_describe_shape(expected.shape)}"
            )
        if value.dtype != expected.dtype:
            raise ValueError(
                f"{what}, input {k} has dtype {value.dtype}, but the example input has "
                f"{expected.dtype}"
            )
    for k, value in enumerate(sample):
        if value.is_floating_point() or value.is_complex():
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                nans = int(torch.isnan(value).sum())
                infs = value.numel() - int(finite.sum()) - nans
                raise ValueError(
                    f"{what}, input {k} is not finite: {nans} NaN and {infs} infinite values "
                    f"of {value.numel()}; calibration data must be finite"
                )
    return sample


def check_calibration(
    calibration: Iterable[tuple[torch.Tensor, ...]] | None,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    reference_for: ReferenceFor | None = None,
) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples as a list, every one checked before any work: each is a tuple of
    tensors with as many entries as ``example_inputs``, the same shapes and dtypes, and finite
    values (no NaN, no inf). ``None`` means the example inputs are the only sample (then they
    must be finite). An iterator is consumed once, into the list. ``reference_for`` (a model
    exported for several sizes): each sample is checked against ``reference_for(index,
    sample)`` instead of ``example_inputs``.

    Raises ``TypeError`` (not a tuple, not a tensor, ``calibration`` not iterable) or
    ``ValueError`` (empty, wrong count, shape or dtype, NaN or inf), naming the sample index and
    the input index: ``"calibration sample 3, input 1 has shape [1, 3, 8, 8], but the example
    input has [1, 3, 16, 16]"``."""
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}"
        )
    if calibration is None:
        return [_check_sample(example_inputs, None, "example_inputs (the calibration sample)")]
    reference = _check_sample_types(example_inputs)
    checked = []
    for index, sample in enumerate(_materialize(calibration)):
        what = f"calibration sample {index}"
        if reference_for is not None:
            typed = _check_sample(sample, None, what)
            if len(typed) != len(reference):
                raise ValueError(
                    f"{what} has {len(typed)} inputs, but the model takes {len(reference)} (the "
                    "example inputs)"
                )
            checked.append(_check_sample(typed, reference_for(index, typed), what))
        else:
            checked.append(_check_sample(sample, reference, what))
    return checked


def _materialize(calibration: object) -> list[object]:
    if isinstance(calibration, torch.Tensor | str | bytes) or not isinstance(calibration, Iterable):
        raise TypeError(
            "calibration must be an iterable of input tuples (for one sample: [(x,)]), got "
            f"{type(calibration).__name__}"
        )
    samples = list(calibration)
    if not samples:
        raise ValueError(
            "calibration is empty: give at least one sample, or None to calibrate on the "
            "example inputs"
        )
    return samples


def _check_sample_types(example_inputs: tuple[object, ...]) -> tuple[torch.Tensor, ...]:
    for k, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{k}] must be a torch.Tensor, got {type(value).__name__}"
            )
    return example_inputs  # type: ignore[return-value]  # every entry checked above
