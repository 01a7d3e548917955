"""Quantization-aware training for an export: ``qat_prepare`` gives the trainable module with the
quantizer the export would use (etkit's exact sampler in place of every grid sampler), and
``export_model`` exports that module, trained, with the parameters it learnt (``QatExport``):
nothing is calibrated again, and the program it lowers is ``etkit_quant.convert_qat``'s.
``load_qat_checkpoint`` puts a trained state into a module ``qat_prepare`` made (the command
line's ``--qat-checkpoint``)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeGuard

import torch
from executorch.backends.arm.quantizer import VgfQuantizer
from executorch.backends.arm.quantizer import (
    get_symmetric_quantization_config as arm_config,
)
from executorch.backends.arm.vgf import VgfCompileSpec
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config as xnnpack_config,
)
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter.core.diagnostics import exception_chain, root_cause
from etkit_exporter.core.errors import ExportError
from etkit_exporter.core.io_params import float_output
from etkit_exporter.export.arguments import (
    CALIBRATED,
    QspecCountError,
    SamplerQSpec,
    check_arguments,
    check_forward,
    check_grid_samplers,
    check_tosa_spec,
    quant_options,
)
from etkit_exporter.export.average_pools import vgf_average_pools
from etkit_exporter.export.quantization import boundary_quantizer
from etkit_exporter.export.sizes import (
    SizeError,
    SizePlan,
    SizeRange,
    check_sizes,
    dynamic_shapes,
    fixed_sizes_refused,
    image_inputs,
    size_range,
    size_text,
)
from etkit_gridsampler.qat import PreparedGridSample, exact_sampler
from etkit_layout import pad_rgb_to_rgba
from etkit_quant import (
    BoundaryQuantizer,
    QatGraphModule,
    Saturation,
    convert_qat,
    fake_quant_params,
    fixed,
    prepare_qat,
    prepared_grid_samplers,
    user_inputs,
    user_outputs,
)
from etkit_quant.normalize import normalize_program
from etkit_quant.qat import SAMPLER_KEY, SHAPES_KEY
from etkit_quant.qat_shapes import PreparedShapes, prepared_shapes

logger = logging.getLogger(__name__)

QAT_KEY: Final = "etkit_exporter_qat"
"""``prepared.meta`` key under which ``qat_prepare`` records what it prepared for: target, TOSA
specification, grid math, the saturation of the fixed ranges on the calibration data and the
tensors entering the coordinate arithmetic."""


def qat_prepare(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    target: str = "vgf",
    calibration: Iterable[tuple[torch.Tensor, ...]] | None = None,
    quantized_input_qspecs: Sequence[QuantizationSpec | None] | None = None,
    quantized_output_qspecs: Sequence[QuantizationSpec | None] | None = None,
    grid_sampler_image_qspec: SamplerQSpec = CALIBRATED,
    grid_sampler_grid_qspec: SamplerQSpec = CALIBRATED,
    grid_sampler_output_qspec: SamplerQSpec = CALIBRATED,
    quantize_grid_sample_output: bool = True,
    grid_math: str = "float",
    tosa_spec: str | None = None,
    exact_samplers: bool = True,
    on_calibration_sample: Callable[[int, int], None] | None = None,
    dynamic_batch: bool = True,
    dynamic_size: Sequence[Any] | None = None,
    sizes: Sequence[tuple[int, int]] | None = None,
) -> QatGraphModule:
    """``model`` prepared for quantization-aware training exactly as ``export_model`` with the
    same arguments would quantize it, so that training and export agree by construction: the
    same capture and normalization, the same quantizer (``etkit_quant.BoundaryQuantizer`` over
    the target's base quantizer, VGF's or XNNPACK's, configured for QAT), the qspecs chosen
    from ``calibration`` as ``export_model`` chooses them, the same graph passes (RGB images
    padded to RGBA at the grid samplers; for VGF, average pools as convolutions), and, with
    ``exact_samplers`` (the default), etkit's exact integer sampler in place of every grid
    sampler (``etkit_gridsampler.qat.exact_sampler``: the forward is the program's integer
    kernel, the backward float ``grid_sample``'s straight-through gradient). Returns
    ``etkit_quant.prepare_qat``'s module, in train mode: train it, then
    ``export_model(prepared, example_inputs, target=...)`` exports it with the parameters it
    learnt (or save ``prepared.state_dict()`` for ``etkit-export --qat-checkpoint``).
    ``exact_samplers=False`` trains through PyTorch's float ``grid_sample`` instead (as Arm's
    Model Gym does; the program's samplers then compute what the model did not train with).

    Shapes: the capture has a dynamic batch (``dynamic_batch``: every input of rank 2 or more
    whose first size is the first input's), so the module trains on batches of any size; with
    ``dynamic_size`` (a range, as ``export_model`` takes it: ``((min height, max height), (min
    width, max width)[, multiple])``) or ``sizes`` (the sizes it will be exported at: the range
    from the smallest to the largest of them and the example's), the image inputs' height and
    width are dynamic too, within it: the module trains on crops of any size in the range and
    exports at any size in it (``export_model``'s ``sizes=`` and ``dynamic_size=``). Without
    either, the height and width are the example's. Calibration samples may be of any batch
    and size the module takes. The state dict holds the learnt parameters and the fake
    quantizes' state only (no constant the capture folded), so it does not depend on a batch or
    crop size. A batch or crop the module does not take is ``ValueError`` in one line at its
    forward, before any work.

    Raises what ``export_model`` raises for these arguments, before any work, and
    ``ValueError`` for a model without trainable parameters, and, naming it and why
    (``UnsupportedOpError``), for a grid sampler the exact sampler cannot mirror; ``SizeError``
    (one line) for a malformed range, an example outside it, or a model whose code fixes the
    batch or the size it was asked to take dynamic."""
    inputs = check_arguments(model, example_inputs, target)
    spec = check_tosa_spec(tosa_spec, target, True)
    crop = crop_range(inputs, sizes, dynamic_size)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model ({type(model).__name__}) has no parameters to train (none with "
            "requires_grad=True): quantization-aware training has nothing to learn; export it "
            "as it is (export_model, or etkit-export without --qat-checkpoint)"
        )
    capture, dynamic = training_capture(inputs, crop, dynamic_batch)
    modes = [m.training for m in model.modules()]
    try:
        check_forward(model.eval(), inputs)
        if capture is not inputs:  # a batch of 1 captured as 2: the model must take it
            check_batch(model, capture)
        with dynamic_capture_refused(crop, dynamic_batch):
            exported = torch.export.export(model, capture, dynamic_shapes=dynamic, strict=True)
        shapes = prepared_shapes(exported)

        def reference_for(index: int, sample: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
            shapes.check(sample, f"calibration sample {index}")
            return tuple(n.meta["val"] for n in exported.graph.nodes if n.name in shapes.names)

        quant = quant_options(
            enabled=True,
            inputs=inputs,
            quantized_input_qspecs=quantized_input_qspecs,
            quantized_output_qspecs=quantized_output_qspecs,
            sampler_image=grid_sampler_image_qspec,
            sampler_grid=grid_sampler_grid_qspec,
            sampler_output=grid_sampler_output_qspec if quantize_grid_sample_output else None,
            calibration=calibration,
            on_sample=on_calibration_sample,
            grid_math=grid_math,
            reference_for=reference_for if dynamic is not None else None,
        )
    finally:
        for module, training in zip(model.modules(), modes, strict=True):
            module.training = training
    check_grid_samplers(exported)
    exported, _ = normalize_program(exported, capture, dynamic_shapes=dynamic)
    for given, count, what in (
        (quant.inputs, len(inputs), "input"),
        (quant.outputs, len(exported.graph_signature.user_outputs), "output"),
    ):
        if given is not None and len(given) != count:
            raise QspecCountError(what, len(given), count)
    quantizer, saturations, coordinates = boundary_quantizer(
        exported, qat_base_quantizer(target, spec), quant, len(inputs)
    )
    for record in saturations:
        if not record.passes():
            logger.warning("saturation: %s", record.message())
    passes: list[Callable[[GraphModule], object]] = []
    if target == "vgf":  # export_model's graph passes for VGF: RGBA textures, average pools
        passes += [pad_rgb_to_rgba, vgf_average_pools]
    try:
        prepared = prepare_qat(
            model,
            capture,
            quantizer,
            calibration=quant.samples,
            on_sample=quant.on_sample,
            passes=passes,
            sampler_replacement=exact_sampler if exact_samplers else None,
            dynamic_shapes=dynamic,
        )
    except Exception as error:
        if target != "vgf" or crop is None or not _symbolic_size_failure(error):
            raise
        raise SizeError(
            f"target 'vgf' with sizes {crop.text()}: ExecuTorch 1.5.1's Arm quantizer cannot "
            "annotate this model with a dynamic height and width (its passes evaluate the "
            f"sizes the model computes from its input as numbers: {root_cause(error)[:160]}); "
            "prepare it for vgf without sizes or dynamic_size (a dynamic batch, one crop "
            "size), or for xnnpack"
        ) from error
    if quant.grid_math == "float":
        coordinates["inputs"] = list(quantizer.coordinate_inputs)
    prepared.meta[QAT_KEY] = {
        "target": target,
        "tosa_spec": spec if target == "vgf" else None,
        "grid_math": quant.grid_math,
        "saturation": tuple(saturations),
        "coordinates": coordinates,
        "sizes": None if crop is None else crop.text(),
        "dynamic_batch": dynamic_batch,
    }
    return prepared


def _symbolic_size_failure(error: BaseException) -> bool:
    text = "\n".join(str(e) for e in exception_chain(error))
    return any(
        mark in text for mark in ("SymInt", "sym_size", "Cannot cast sym", "symbolic", "Symbolic")
    )


def crop_range(
    inputs: tuple[torch.Tensor, ...],
    sizes: Sequence[tuple[int, int]] | None,
    dynamic_size: Sequence[Any] | None,
) -> SizeRange | None:
    """The heights and widths ``qat_prepare`` captures dynamic: ``dynamic_size`` (checked as
    ``export_model`` checks it), or the range spanning ``sizes`` and the example's size;
    ``None`` when neither is given. ``SizeError`` (one line) for a malformed range or sizes,
    both given, or an example outside the range."""
    if sizes is None and dynamic_size is None:
        return None
    if sizes is not None and dynamic_size is not None:
        raise SizeError(
            "give qat_prepare the sizes it will be exported at or a size range, not both"
        )
    example, _ = image_inputs(inputs)
    if dynamic_size is not None:
        chosen = size_range(dynamic_size)
    else:
        plan = check_sizes(sizes, None, inputs, "vgf")
        assert plan is not None
        listed = [*plan.enumerated, example]
        heights, widths = [s[0] for s in listed], [s[1] for s in listed]
        chosen = SizeRange((min(heights), max(heights)), (min(widths), max(widths)))
    why = chosen.outside(example)
    if why is not None:
        raise SizeError(
            f"size range {chosen.text()}: the example inputs' size {size_text(example)} is not "
            f"in the range ({why}); give example inputs of a size within it"
        )
    return chosen


def training_capture(
    inputs: tuple[torch.Tensor, ...], crop: SizeRange | None, dynamic_batch: bool
) -> tuple[tuple[torch.Tensor, ...], Any]:
    """The inputs ``qat_prepare`` captures on and ``torch.export``'s dynamic shapes (``None``:
    all static): the batch of every input of rank 2 or more whose first size is the first
    input's (``dynamic_batch``; a batch of 1 is captured as 2, the inputs repeated, since
    ``torch.export`` takes a dimension of size 1 as fixed), and the image inputs' height and
    width within ``crop`` (``sizes.dynamic_shapes``)."""
    batch = int(inputs[0].shape[0]) if inputs[0].dim() >= 2 else None
    batched = [
        k for k, x in enumerate(inputs) if dynamic_batch and x.dim() >= 2 and x.shape[0] == batch
    ]
    per_input: list[dict[int, Any]] = [{} for _ in inputs]
    if crop is not None:
        example, images = image_inputs(inputs)
        plan = SizePlan(example, images, dynamic=crop)
        for k, dims in enumerate(dynamic_shapes(plan, inputs) or ()):
            per_input[k].update(dims or {})
    if batched:
        dim = torch.export.Dim("batch", min=1)
        for k in batched:
            per_input[k][0] = dim
    if not any(per_input):
        return inputs, None
    if not (batched and batch == 1):
        return inputs, tuple(dims or None for dims in per_input)
    capture = tuple(
        torch.cat([x, x]) if k in batched and batch == 1 else x for k, x in enumerate(inputs)
    )
    return capture, tuple(dims or None for dims in per_input)


def check_batch(model: torch.nn.Module, capture: tuple[torch.Tensor, ...]) -> None:
    """``SizeError`` (one line) unless ``model``'s forward runs at ``capture``'s batch (2)."""
    try:
        with torch.no_grad():
            model(*capture)
    except Exception as error:
        raise SizeError(
            f"the model cannot train on a dynamic batch: its forward fails at batch 2 "
            f"({root_cause(error)}); prepare it with dynamic_batch=False (it then trains at the "
            "example inputs' batch only)"
        ) from error


@contextmanager
def dynamic_capture_refused(crop: SizeRange | None, dynamic_batch: bool) -> Iterator[None]:
    """Around ``qat_prepare``'s dynamic capture: a model whose code fixes its batch or its size
    (``torch.export``'s constraint violation) is ``SizeError`` in one line saying which, where,
    and what to give instead."""
    span = crop.text() if crop is not None else "its batch"
    try:
        with fixed_sizes_refused(SizePlan((0, 0), (), dynamic=crop)):
            yield
    except SizeError as error:
        what = str(error).split("): ", 1)[-1].split("; export a list of sizes", 1)[0]
        text = "\n".join(str(e) for e in exception_chain(error))
        if dynamic_batch and "You marked batch as dynamic" in text:
            raise SizeError(
                f"the model cannot train on a dynamic batch: {what}; prepare it with "
                "dynamic_batch=False (it then trains at the example inputs' batch only), or "
                "compute that from the input's size with tensor ops"
            ) from error
        raise SizeError(
            f"the model cannot take dynamic sizes ({span}): {what}; prepare it without sizes "
            "or dynamic_size (it then trains and exports at the example inputs' height and "
            "width only), or compute that from the input's size with tensor ops"
        ) from error


def qat_base_quantizer(target: str, tosa_spec: str) -> Any:
    """The target's base quantizer as ``lowering.target_backend`` configures it, for QAT (its
    symmetric configuration with fake quantizes: ``is_qat=True``)."""
    if target == "vgf":
        base = VgfQuantizer(VgfCompileSpec(tosa_spec))
        base.set_global(arm_config(is_qat=True))
        return base
    return XNNPACKQuantizer().set_global(xnnpack_config(is_qat=True))


def load_qat_checkpoint(prepared: QatGraphModule, checkpoint: str | Path) -> QatGraphModule:
    """Loads ``checkpoint`` (a file ``torch.save`` wrote: the trained module's ``state_dict()``,
    or a dict holding it under ``"state_dict"``) into ``prepared`` (``qat_prepare``'s module
    for the same model and options), after checking that every name and shape matches.
    Returns ``prepared``. Raises ``ValueError`` in one line naming the file and the first
    parameter or buffer that is missing, unexpected or of another shape (and how many more)."""
    path = Path(checkpoint)
    state = read_checkpoint(path)
    check_checkpoint(prepared, state, path)
    prepared.load_state_dict(state, strict=True)
    return prepared


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in ``path``; ``ValueError`` in one line when it is missing, unreadable
    or holds something else."""
    if not path.is_file():
        raise ValueError(f"QAT checkpoint {path} does not exist")
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"QAT checkpoint {path} cannot be read: {root_cause(error)}; save the trained "
            "module's state with torch.save(prepared.state_dict(), PATH)"
        ) from error
    if isinstance(value, Mapping) and isinstance(value.get("state_dict"), Mapping):
        value = value["state_dict"]
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    ):
        raise ValueError(
            f"QAT checkpoint {path} holds a {type(value).__name__}, not a state dict (names to "
            "tensors); save it with torch.save(prepared.state_dict(), PATH)"
        )
    return dict(value)


def check_checkpoint(
    prepared: torch.nn.Module, state: Mapping[str, torch.Tensor], path: Path | str
) -> None:
    """Raises ``ValueError`` (one line: the first mismatch, and how many there are) unless
    ``state`` has exactly ``prepared``'s parameter and buffer names, with their shapes."""
    expected = prepared.state_dict()
    problems: list[str] = []
    for name, value in expected.items():
        given = state.get(name)
        if given is None:
            problems.append(f"'{name}' ({_shape(value)}) is missing from it")
        elif given.shape != value.shape:
            problems.append(
                f"'{name}' has shape {_shape(given)} there but {_shape(value)} in the model"
            )
    problems += [
        f"it holds '{name}', which the model has not" for name in state if name not in expected
    ]
    if problems:
        more = f" ({len(problems) - 1} more mismatches)" if len(problems) > 1 else ""
        raise ValueError(
            f"QAT checkpoint {path} does not match the prepared model: {problems[0]}{more}; "
            "it must be the state_dict() of the module qat_prepare made from the same model with "
            "the same target, calibration and qspec options"
        )


def _shape(value: torch.Tensor) -> str:
    return "[" + ", ".join(map(str, value.shape)) + "]"


# -- export --------------------------------------------------------------------------------------


class QatQuantized(NamedTuple):
    """``QatExport.quantize``'s result: the model lowered, the quantizer view of its
    boundaries, and the report's saturation records and coordinate-input section."""

    converted: GraphModule
    quantizer: BoundaryQuantizer
    report: tuple[tuple[Saturation, ...], dict[str, Any]]


@dataclass
class QatExport:
    """A QAT-trained module as ``export_model`` exports it: ``prepared`` (an eval-mode copy of
    the caller's module: the caller's is never switched or changed), ``float_model`` (the same
    trained network with every fake quantize taken out and PyTorch's samplers in place: the
    export's float model, captured and verified against as any float model) and what
    ``prepared`` was prepared for (``record``, empty for a module ``etkit_quant.prepare_qat``
    made directly)."""

    prepared: QatGraphModule
    float_model: GraphModule
    record: Mapping[str, Any] = field(default_factory=dict)
    converted: GraphModule | None = field(default=None, repr=False)  # once quantized

    @property
    def grid_math(self) -> str | None:
        value = self.record.get("grid_math")
        return None if value is None else str(value)

    def quantize(
        self, inputs: tuple[torch.Tensor, ...] | None = None, dynamic_shapes: Any = None
    ) -> QatQuantized:
        """The quantized model the program is lowered from (``convert_qat``: every quantize
        with the parameters the module trained with), a ``BoundaryQuantizer`` holding the
        boundary qspecs the module's annotations give (the pipeline reads which inputs and
        outputs are quantized), and for the report the saturation records of its preparation
        (its fixed ranges on the calibration data) and its coordinate-input section.
        ``inputs`` without ``dynamic_shapes`` (a method of one size): the model at their size,
        what it computes from the sizes alone folded as a capture at that size folds it
        (``etkit_quant.convert_qat(example_inputs=...)``); with ``dynamic_shapes`` (a range) it
        keeps its dynamic dimensions."""
        fixed_at = inputs if dynamic_shapes is None else None
        self.converted = convert_qat(self.prepared, example_inputs=fixed_at)
        ins, outs = boundary_qspecs(self.prepared)
        # Its base is never run: the annotations are the prepared module's.
        quantizer = BoundaryQuantizer(XNNPACKQuantizer(), input_qspecs=ins, output_qspecs=outs)
        coordinates = dict(self.record.get("coordinates") or {})
        quantizer.coordinate_inputs = tuple(coordinates.get("inputs", ()))
        saturation = tuple(self.record.get("saturation") or ())
        return QatQuantized(self.converted, quantizer, (saturation, coordinates))

    def section(self, example_inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        """report.json's ``qat``: what the module was prepared for, which samplers trained
        through the exact sampler (and which through PyTorch's float one), and how far the
        quantized model lies from the module's eval forward on the example inputs."""
        sites = prepared_grid_samplers(self.prepared)
        exact = [
            s.name
            for s in sites
            if s.replacement is not None
            and isinstance(self.prepared.get_submodule(s.replacement), PreparedGridSample)
        ]
        section: dict[str, Any] = {
            "recalibrated": False,
            "prepared_for": {k: self.record.get(k) for k in ("target", "tosa_spec", "grid_math")},
            "exact_samplers": exact,
            "float_samplers": [s.name for s in sites if s.name not in exact],
        }
        if self.converted is not None:  # (at the example's size: a method's is folded at its)
            with torch.no_grad():
                at_example = convert_qat(self.prepared, example_inputs=example_inputs)
                outputs = _flat(at_example(*example_inputs))
            section["quantized_model_vs_qat_model"] = self.compare(outputs, example_inputs)
        return section

    def compare_program(
        self,
        raw_outputs: Sequence[torch.Tensor],
        io_params: Mapping[str, Any],
        example_inputs: tuple[torch.Tensor, ...],
    ) -> list[dict[str, Any]]:
        """The program's outputs (as it returned them, ``io_params`` giving their
        quantization) against the module's eval forward on ``example_inputs``: ``compare``."""
        outputs = [
            float_output(y, entry)
            for y, entry in zip(raw_outputs, io_params["outputs"], strict=True)
        ]
        return self.compare(outputs, example_inputs)

    def compare(
        self, outputs: Sequence[torch.Tensor], example_inputs: tuple[torch.Tensor, ...]
    ) -> list[dict[str, Any]]:
        """Each of ``outputs`` (float, as dequantized) against the module's eval forward on
        ``example_inputs``: max abs error and, for a quantized output, the steps of its
        quantization apart (max, and the share of values a step or more off)."""
        with torch.no_grad():
            expected = _flat(self.prepared(*example_inputs))
        fakes = _output_fakes(self.prepared)
        rows = []
        for index, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            error = (got.contiguous().reshape(want.shape).float() - want).abs()
            row: dict[str, Any] = {"output": index, "max_abs_error": float(error.max())}
            if index < len(fakes) and fakes[index] is not None:
                steps = torch.round(error / fake_quant_params(fakes[index]).scale)
                row["max_steps"] = int(steps.max())
                row["fraction_off"] = float((steps > 0).float().mean())
            rows.append(row)
        return rows


def is_qat_model(model: object) -> TypeGuard[QatGraphModule]:
    """Whether ``model`` is a module ``etkit_quant.prepare_qat`` (or ``qat_prepare``) returned."""
    return isinstance(model, QatGraphModule)


def quantization_given(
    input_qspecs: object,
    output_qspecs: object,
    image_qspec: object,
    grid_qspec: object,
    output_qspec: object,
    quantize_output: bool,
    calibration: object,
    enabled: bool,
) -> dict[str, bool]:
    """Which of ``export_model``'s quantization arguments (in its order) the caller set, by the
    name a refusal gives it."""
    return {
        "quantized_input_qspecs": input_qspecs is not None,
        "quantized_output_qspecs": output_qspecs is not None,
        "grid_sampler_image_qspec": image_qspec is not CALIBRATED,
        "grid_sampler_grid_qspec": grid_qspec is not CALIBRATED,
        "grid_sampler_output_qspec": output_qspec is not CALIBRATED,
        "quantize_grid_sample_output=False": not quantize_output,
        "calibration": calibration is not None,
        "enable_pt2e_quantization=False": not enabled,
    }


def qat_export(
    model: QatGraphModule,
    *,
    target: str,
    tosa_spec: str | None,
    given: Mapping[str, bool],
) -> QatExport:
    """The ``QatExport`` of a trained module for ``export_model``. ``given``: which of
    ``export_model``'s quantization arguments the caller set (by name): each is refused, in one
    line, since the module carries its quantization; so are a target or TOSA specification
    other than the ones ``qat_prepare`` prepared it for."""
    for name, was_given in given.items():
        if was_given:
            raise ValueError(
                f"{name} does not apply to a QAT-trained model: its quantization (qspecs, "
                "ranges) is the one it was prepared and trained with, and nothing is calibrated "
                f"again; give {name} to qat_prepare instead"
            )
    record: Mapping[str, Any] = model.meta.get(QAT_KEY) or {}
    prepared_for = record.get("target")
    if prepared_for is not None and prepared_for != target:
        raise ValueError(
            f"the QAT model was prepared for target {prepared_for!r} (its base quantizer's "
            f"annotations), not {target!r}: export it for {prepared_for}, or prepare and train it "
            f"for {target} (qat_prepare(..., target={target!r}))"
        )
    spec = record.get("tosa_spec")
    if target == "vgf" and spec is not None and tosa_spec is not None and tosa_spec != spec:
        raise ValueError(
            f"the QAT model was prepared for TOSA specification {spec!r}, not {tosa_spec!r}: "
            "export it with the specification it was prepared for"
        )
    prepared = copy.deepcopy(model)
    prepared.eval()
    return QatExport(prepared, float_view(prepared), record)


def float_view(prepared: GraphModule) -> GraphModule:
    """The network ``prepared`` trains, in float: a ``GraphModule`` of its graph with every fake
    quantize taken out and every replaced grid sampler PyTorch's ``aten`` op again, reading
    ``prepared``'s trained parameters (copies). Batch norms as ``prepared``'s mode computes
    them (call it on an eval-mode module)."""
    root = copy.deepcopy(prepared)
    graph = root.graph
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        record = node.meta.get(SAMPLER_KEY)
        module = root.get_submodule(str(node.target))
        if isinstance(module, FakeQuantizeBase):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif record is not None:
            node.op, node.target = "call_function", record["target"]
            node.args, node.kwargs = (*node.args[:2], *record["args"]), dict(record["kwargs"])
    graph.eliminate_dead_code()
    graph.lint()
    model = GraphModule(root, graph, class_name="QatFloatModel")
    model.eval()
    shapes = prepared.meta.get(SHAPES_KEY)
    if isinstance(shapes, PreparedShapes):  # the export's sizes: those the module takes
        model.register_forward_pre_hook(_ShapeCheck(shapes))
    return model


@dataclass(frozen=True)
class _ShapeCheck:
    """A float view's forward pre-hook: inputs of a batch or size the QAT module does not take
    are refused in one line (``export_model``'s checks run the float model at every size it
    exports) where the float graph would run on, or fail deep inside; a capture (fake sizes)
    passes."""

    shapes: PreparedShapes

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if not torch.compiler.is_compiling():
            self.shapes.check(args, "the QAT-trained model")


def boundary_qspecs(
    prepared: GraphModule,
) -> tuple[tuple[QuantizationSpec | None, ...], tuple[QuantizationSpec | None, ...]]:
    """The boundary qspec of each user input and output of ``prepared``, from its annotations
    (an input is quantized when its placeholder's annotation gives it an output qspec, an
    output when it leaves the graph through a fake quantize), as fixed qspecs with the
    parameters each fake quantize applies (``None``: float)."""
    modules = dict(prepared.named_modules(remove_duplicate=False))
    inputs: list[QuantizationSpec | None] = []
    for node in user_inputs(prepared):
        annotation = node.meta.get("quantization_annotation")
        quantized = annotation is not None and annotation.output_qspec is not None
        fakes = [_fake_quant(user, modules) for user in node.users]
        fake = next((f for f in fakes if f is not None), None)
        if quantized and fake is None:
            raise ExportError(
                f"the QAT model quantizes input {node.name}, but no fake quantize follows it"
            )
        inputs.append(_fixed_qspec(fake) if quantized else None)
    outputs = [
        None if fake is None else _fixed_qspec(fake) for fake in _output_fakes(prepared, modules)
    ]
    return tuple(inputs), tuple(outputs)


def _output_fakes(
    prepared: GraphModule, modules: dict[str, torch.nn.Module] | None = None
) -> list[Any]:
    modules = (
        modules if modules is not None else dict(prepared.named_modules(remove_duplicate=False))
    )
    return [_fake_quant(node, modules) for node in user_outputs(prepared)]


def _fake_quant(node: Node, modules: Mapping[str, torch.nn.Module]) -> Any:
    if node.op != "call_module":
        return None
    module = modules.get(str(node.target))
    return module if isinstance(module, FakeQuantizeBase) else None


def _fixed_qspec(fake: Any) -> QuantizationSpec:
    params = fake_quant_params(fake)
    return fixed(params.scale, params.zero_point, params.dtype, params.quant_min, params.quant_max)


def _flat(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _flat(item)]
    raise TypeError(f"the model returned a {type(value).__name__}, not tensors")


def prepared_from_checkpoint(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    checkpoint: str | Path,
    **options: Any,
) -> QatGraphModule:
    """``etkit-export --qat-checkpoint``: ``model`` (the float model) prepared by
    ``qat_prepare(model, example_inputs, **options)`` (the options of the export), and the
    trained state in ``checkpoint`` loaded into it (``load_qat_checkpoint``). The file is read
    first, so that a missing or unreadable one is answered before any work."""
    path = Path(checkpoint)
    state = read_checkpoint(path)
    prepared = qat_prepare(model, example_inputs, **options)
    check_checkpoint(prepared, state, path)
    prepared.load_state_dict(state, strict=True)
    return prepared
