"""``quantize``: export, prepare, calibrate and convert a model with a PT2E quantizer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.fx import GraphModule
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer

from etkit_quant.boundary import BoundaryQuantizer


def _check_example_inputs(example_inputs: object, what: str) -> tuple[torch.Tensor, ...]:
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"{what} must be a tuple of tensors, got {type(example_inputs).__name__}")
    for k, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}[{k}] must be a torch.Tensor, got {type(value).__name__}")
    return example_inputs


def quantize(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    quantizer: Quantizer,
    *,
    calibration: Iterable[tuple[torch.Tensor, ...]] | None = None,
    is_qat: bool = False,
) -> GraphModule:
    """Exports ``model`` (strict), prepares it with ``quantizer``, runs it on each tuple of
    ``calibration`` (the example inputs when ``None``) and converts it. Returns the converted
    graph module, with quantize/dequantize nodes.

    Raises ``TypeError`` for a model that is not a ``torch.nn.Module``, example inputs that are
    not a tuple of tensors, or a quantizer that is not a PT2E ``Quantizer``; ``ValueError`` when a
    ``BoundaryQuantizer``'s qspec counts do not fit the model (checked right after export, before
    anything else runs)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _check_example_inputs(example_inputs, "example_inputs")
    if not isinstance(quantizer, Quantizer):
        raise TypeError(
            f"quantizer must be a torchao PT2E Quantizer, got {type(quantizer).__name__}"
        )
    exported = torch.export.export(model, inputs, strict=True)
    # torch 2.13 adds a _guards_fn call_module by default, which PT2E quantizers reject.
    graph_module: Any = exported.module(check_guards=False)
    if isinstance(quantizer, BoundaryQuantizer):
        num_inputs = sum(1 for n in graph_module.graph.nodes if n.op == "placeholder" and n.users)
        num_outputs = len(exported.graph_signature.user_outputs)
        quantizer.check_counts(num_inputs, num_outputs)
    prepare = prepare_qat_pt2e if is_qat else prepare_pt2e
    prepared = prepare(graph_module, quantizer)
    batches = [inputs] if calibration is None else calibration
    with torch.no_grad():
        for k, batch in enumerate(batches):
            prepared(*_check_example_inputs(batch, f"calibration[{k}]"))
    converted: GraphModule = convert_pt2e(prepared)
    return converted
