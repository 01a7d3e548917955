"""``quantize``: export, prepare, calibrate and convert a model with a PT2E quantizer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.fx import GraphModule
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer

from etkit_quant.biases import snap_float_biases
from etkit_quant.boundary import BoundaryQuantizer, own_constants, user_inputs
from etkit_quant.calibration import OnSample, check_calibration
from etkit_quant.conv_bn_fold import conv_bn_folds_only_where_they_match
from etkit_quant.narrow_ranges import clamp_narrow_ranges
from etkit_quant.observers import ObserverStates, load_observer_states
from etkit_quant.requantize import requantize_shared_inputs


def _check_example_inputs(example_inputs: object, what: str) -> tuple[torch.Tensor, ...]:
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"{what} must be a tuple of tensors, got {type(example_inputs).__name__}")
    for k, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}[{k}] must be a torch.Tensor, got {type(value).__name__}")
    return example_inputs


def arm_lowering(quantizer: Quantizer) -> bool:
    """Whether ``quantizer`` (a ``BoundaryQuantizer``'s base, or itself) is one of ExecuTorch's
    Arm quantizers, whose lowering computes a bilinear resize on its input's integers in its
    output's parameters (``requantize.INTERPOLATING_OPS``) and clamps every rescale at the
    type's range (``narrow_ranges``)."""
    if isinstance(quantizer, BoundaryQuantizer):
        return quantizer.arm_base
    return type(quantizer).__module__.startswith("executorch.backends.arm")


def fit_to_backend(converted: GraphModule, arm: bool) -> None:
    """What ``quantize`` and ``convert_qat`` do to a converted model so that it computes what
    the backend will: ops that backends compute on the integers themselves read their inputs
    in their output's parameters (``requantize_shared_inputs``; exact, but for a rounding in
    front of each bilinear resize on Arm, where the program rounds there), on Arm a narrowed
    int8 range holds where the lowering would not keep it (``clamp_narrow_ranges``: exact),
    and float biases that the backend quantizes when it lowers are the values it will compute
    with (``snap_float_biases``)."""
    requantize_shared_inputs(converted, interpolations=arm)
    if arm:
        clamp_narrow_ranges(converted)
    snap_float_biases(converted)


def quantize(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    quantizer: Quantizer,
    *,
    calibration: Iterable[tuple[torch.Tensor, ...]] | None = None,
    is_qat: bool = False,
    on_sample: OnSample | None = None,
    dynamic_shapes: Any = None,
    observers: ObserverStates | None = None,
    on_calibrated: Callable[[GraphModule], None] | None = None,
) -> GraphModule:
    """Exports ``model`` (strict), prepares it with ``quantizer``, runs it on each tuple of
    ``calibration`` (the example inputs when ``None``) and converts it. Returns the converted
    graph module, with quantize/dequantize nodes. ``on_sample(done, total)`` is called after
    each calibration sample (for a progress bar). Ops that backends compute on the integers
    themselves read their inputs in their output's parameters, and the rest of
    ``fit_to_backend``.

    Every calibration sample is checked before any work (``check_calibration``: a tuple of
    finite tensors with the example inputs' count, shapes and dtypes; the error names the sample
    and the input). Raises ``TypeError`` for a model that is not a ``torch.nn.Module``, example
    inputs that are not a tuple of tensors, or a quantizer that is not a PT2E ``Quantizer``;
    ``ValueError`` for a bad calibration sample, or when a ``BoundaryQuantizer``'s qspec counts
    do not fit the model (checked right after export, before anything else runs).

    ``dynamic_shapes``: ``torch.export``'s, for a model exported with dynamic dimensions (the
    converted graph keeps them; calibration samples may then be of any size it takes, checked
    against the captured inputs after the export). ``observers``
    (``etkit_quant.observers.observer_states`` of a calibrated prepare of the same model, at
    another input size): loaded into this prepare's
    observers instead of running any calibration sample, so that this conversion gives the
    same quantization parameters (``ValueError`` when the two graphs differ in more than their
    shapes). ``on_calibrated(prepared)`` is called after calibration, before conversion (to
    take ``observer_states`` of it)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _check_example_inputs(example_inputs, "example_inputs")
    if not isinstance(quantizer, Quantizer):
        raise TypeError(
            f"quantizer must be a torchao PT2E Quantizer, got {type(quantizer).__name__}"
        )
    # with dynamic dimensions, samples of other sizes: checked against the captured inputs
    samples = check_calibration(calibration, inputs) if dynamic_shapes is None else None
    exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True)
    # torch 2.13 adds a _guards_fn call_module by default, which PT2E quantizers reject.
    graph_module: Any = exported.module(check_guards=False)
    if samples is None:
        captured = tuple(n.meta["val"] for n in user_inputs(graph_module))
        samples = check_calibration(calibration, captured)
    # Quantizers' passes write into weights (the Arm quantizer folds `conv(x) * c` into the
    # conv's weights in place): the caller's model must not see it.
    own_constants(graph_module)
    if isinstance(quantizer, BoundaryQuantizer):
        num_inputs = len(user_inputs(graph_module))
        num_outputs = len(exported.graph_signature.user_outputs)
        quantizer.check_counts(num_inputs, num_outputs)
    prepare = prepare_qat_pt2e if is_qat else prepare_pt2e
    prepared = prepare(graph_module, quantizer)
    if observers is not None:
        load_observer_states(prepared, observers)
    else:
        with torch.no_grad():
            for done, sample in enumerate(samples, start=1):
                prepared(*sample)
                if on_sample is not None:
                    on_sample(done, len(samples))
    if on_calibrated is not None:
        on_calibrated(prepared)
    with conv_bn_folds_only_where_they_match():  # a batch norm left alone: no 108 exports
        converted: GraphModule = convert_pt2e(prepared)
    fit_to_backend(converted, arm_lowering(quantizer))
    return converted
