"""The arguments of ``export_model`` checked before any work: the model and its example
inputs, the target, the TOSA specification, the quantization options and extra artifacts; and
the names the command line shares (``TARGETS``, ``VGF_TOSA_SPEC``, from
``etkit_exporter.core.targets``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias, TypedDict

import torch
from executorch.backends.arm.tosa import TosaSpecification
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter.artifact.etrecord import RECORD_CONTENTS
from etkit_exporter.core.diagnostics import root_cause
from etkit_exporter.core.targets import TARGETS, VGF_TOSA_SPEC
from etkit_quant import check_calibration
from etkit_quant.boundary import GRID_MATHS
from etkit_quant.graph import is_grid_sampler
from etkit_quant.samples import ReferenceFor

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


StageCallback = Callable[[str, float], None]


class QspecCountError(ValueError):
    """Not one qspec per input (``boundary`` "input") or per output ("output"): ``given`` of
    them for ``count``."""

    def __init__(self, boundary: str, given: int, count: int) -> None:
        self.boundary, self.given, self.count = boundary, given, count
        super().__init__(
            f"{boundary}_qspecs has {given} entries but the model has {count} "
            f"{'user inputs' if boundary == 'input' else 'outputs'}; give one qspec (or None) "
            f"per {boundary}"
        )


class UnproducibleQspecError(ValueError):
    """A boundary qspec the target cannot produce where the model computes that boundary
    (``export.quantization.refuse_unproducible_outputs``): ``boundary`` ("output 0"), ``qspec``
    (its description) and ``op`` (the node that would have to write it). Raised before
    calibration; the command line reports it as a usage error."""

    def __init__(self, message: str, boundary: str, qspec: str, op: str) -> None:
        self.boundary, self.qspec, self.op = boundary, qspec, op
        super().__init__(message)


class Calibrated:
    """The default of a grid-sampler qspec: chosen from the calibration data."""

    def __repr__(self) -> str:
        return "CALIBRATED"


CALIBRATED: Final = Calibrated()


SamplerQSpec: TypeAlias = "QuantizationSpec | Calibrated | None"


class Rewrites(TypedDict):
    """``normalize_program``'s rewrites of float coordinate arithmetic (``QuantOptions.rewrites``)
    by name."""

    channel_ops: bool
    affine_grids: bool


@dataclass(frozen=True)
class QuantOptions:
    enabled: bool
    inputs: tuple[QuantizationSpec | None, ...] | None
    outputs: tuple[QuantizationSpec | None, ...] | None
    sampler_image: SamplerQSpec
    sampler_grid: SamplerQSpec
    sampler_output: SamplerQSpec
    samples: tuple[tuple[torch.Tensor, ...], ...]
    on_sample: Callable[[int, int], None] | None
    grid_math: str = "float"
    state: tuple[tuple[int, int], ...] = ()  # (input, output) of each state pair (export.state)

    @property
    def float_coordinates(self) -> bool:
        """Whether the coordinate arithmetic stays float (float grid math, or no quantization)."""
        return not self.enabled or self.grid_math == "float"

    def rewrites(self, target: str) -> Rewrites:
        """``normalize_program``'s rewrites of float coordinate arithmetic: per-channel ops of
        slices where it stays float, and there on XNNPACK also fixed-size ``affine_grid`` as
        elementwise ops (a CPU backend; a VGF keeps the product Arm's lowering makes)."""
        return {
            "channel_ops": self.float_coordinates,
            "affine_grids": self.float_coordinates and target == "xnnpack",
        }


def quant_options(
    *,
    enabled: bool,
    inputs: tuple[torch.Tensor, ...],
    quantized_input_qspecs: Sequence[QuantizationSpec | None] | None,
    quantized_output_qspecs: Sequence[QuantizationSpec | None] | None,
    sampler_image: SamplerQSpec,
    sampler_grid: SamplerQSpec,
    sampler_output: SamplerQSpec,
    calibration: Iterable[tuple[torch.Tensor, ...]] | None,
    on_sample: Callable[[int, int], None] | None,
    grid_math: object,
    reference_for: ReferenceFor | None = None,
) -> QuantOptions:
    """``export_model``'s and ``qat_prepare``'s quantization arguments checked (one line for a
    caller's mistake, uint8 refused when quantizing) into ``QuantOptions``."""
    quant = QuantOptions(
        enabled=enabled,
        inputs=check_qspec_list(quantized_input_qspecs, "quantized_input_qspecs"),
        outputs=check_qspec_list(quantized_output_qspecs, "quantized_output_qspecs"),
        sampler_image=sampler_image,
        sampler_grid=sampler_grid,
        sampler_output=sampler_output,
        samples=tuple(check_calibration(calibration, inputs, reference_for=reference_for)),
        on_sample=on_sample,
        grid_math=check_grid_math(grid_math),
    )
    if quant.enabled:
        refuse_unsigned(quant)
    return quant


def check_arguments(
    model: object,
    example_inputs: object,
    target: object,
) -> tuple[torch.Tensor, ...]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}"
        )
    if not example_inputs:
        raise ValueError("example_inputs is empty: the model needs at least one input")
    for index, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{index}] must be a torch.Tensor, got {type(value).__name__}"
            )
        check_example_tensor(value, f"example_inputs[{index}]")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return example_inputs


def check_tosa_spec(tosa_spec: object, target: str, quantized: bool) -> str:
    """The TOSA specification to lower to, checked (``VGF_TOSA_SPEC`` when ``None``)."""
    if tosa_spec is None:
        return VGF_TOSA_SPEC
    if not isinstance(tosa_spec, str):
        raise TypeError(f"tosa_spec must be a string such as {VGF_TOSA_SPEC!r}")
    if target != "vgf":
        raise ValueError(f"tosa_spec applies to target 'vgf' only, not {target!r}")

    try:
        parsed = TosaSpecification.create_from_string(tosa_spec)
    except ValueError as error:
        raise ValueError(
            f"tosa_spec {tosa_spec!r} is not a TOSA specification ({error}); e.g. {VGF_TOSA_SPEC!r}"
        ) from None
    if quantized and not parsed.support_integer():
        raise ValueError(
            f"tosa_spec {tosa_spec!r} has no INT profile, and a quantized export lowers integer "
            f"operators: add +INT (e.g. {VGF_TOSA_SPEC!r}) or export with quantization off"
        )
    return tosa_spec


def check_etrecord(etrecord: object) -> bool:
    """Whether the ETRecord is to be full (``etrecord``: one of ``RECORD_CONTENTS``)."""
    if etrecord not in RECORD_CONTENTS:
        raise ValueError(f"etrecord must be one of {', '.join(RECORD_CONTENTS)}, not {etrecord!r}")
    return etrecord == "full"


def check_extra_artifacts(extra: object) -> dict[str, bytes]:
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra_artifacts must map file names to bytes, got {type(extra).__name__}")
    reserved = {
        "model.pte", "model.bpte", "model.bpte.json", "io_quant_params.json", "report.json",
        "report.md", "intermediates", "etrecord.bin", "etrecord.json", "scenario", "timings.json",
    }  # fmt: skip
    checked = {}
    for name, data in extra.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"extra_artifacts name {name!r} must be a plain file name")
        if name in reserved or name.startswith("etkit-") or name.startswith("verify_output_"):
            raise ValueError(f"extra_artifacts name {name!r} is one etkit writes itself")
        if not isinstance(data, bytes):
            raise TypeError(f"extra_artifacts[{name!r}] must be bytes, got {type(data).__name__}")
        checked[name] = data
    return checked


def check_example_tensor(value: torch.Tensor, what: str) -> None:
    """Refuses a tensor an export cannot take as an example or calibration input: not a dense
    CPU tensor, a float type other than float32, NaN or infinite values. The error names
    ``what`` and says what to give instead."""
    if value.device.type != "cpu" or value.layout != torch.strided:
        raise TypeError(
            f"{what} is a {value.device.type} tensor with layout {value.layout}; give a dense "
            "CPU tensor (.to('cpu'), .to_dense())"
        )
    if value.dtype.is_floating_point and value.dtype != torch.float32:
        raise TypeError(
            f"{what} is {str(value.dtype).removeprefix('torch.')}; etkit exports float32 "
            "models: convert the model and its inputs with .float()"
        )
    if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise ValueError(
            f"{what} holds {bad} NaN or infinite values; quantization parameters and "
            "verification need finite data: give finite values"
        )


def check_forward(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Runs the model once on its example inputs, so that inputs of the wrong number, rank or
    shape fail here with the model's own error rather than deep inside ``torch.export``."""
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as error:
        shapes = ", ".join("x".join(map(str, x.shape)) or "scalar" for x in inputs)
        raise ValueError(
            f"the model's forward fails on the example inputs ({shapes}): {root_cause(error)}; "
            "give inputs of the number and shapes its forward takes"
        ) from error


def check_grid_samplers(program: ExportedProgram) -> None:
    for node in program.graph.nodes:
        image = node.args[0] if is_grid_sampler(node) else None
        value = image.meta.get("val") if isinstance(image, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() != 4:
            raise ValueError(
                f"{node.name} samples a {value.dim()}-D input ({'x'.join(map(str, value.shape))}):"
                " etkit exports 2-D grid_sample only (image N x C x H x W, grid N x Ho x Wo x 2);"
                " reshape volumes into batches of 2-D images"
            )


def check_no_state(program: ExportedProgram) -> None:
    """Refuses a captured program that still writes a buffer (``export.state`` lifts every
    buffer a forward writes before capture: one it did not see, written only on some inputs,
    would be dropped or mistyped by the program without a word)."""
    mutated = sorted(mutated_buffers(program))
    if mutated:
        names = ", ".join(repr(name) for name in mutated)
        raise ValueError(
            f"the model updates its buffer{'s' if len(mutated) > 1 else ''} {names} in forward "
            "on the example inputs only as captured, not when run (a state etkit could not "
            "lift): take it as an input, return its new value and name the pair with state="
        )


def mutated_buffers(program: ExportedProgram) -> set[str]:
    """The buffers ``program`` writes: those its signature says it mutates (a functional
    graph) and those an in-place op of the graph writes, directly or through a view of it (the
    graph torch.export captures keeps ``copy_`` in place, its signature silent)."""
    signature = program.graph_signature
    buffers = dict(signature.inputs_to_buffers)
    found = set(signature.buffers_to_mutate.values())
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for argument, value in zip(schema.arguments, node.args, strict=False):
            alias = argument.alias_info
            if alias is None or not alias.is_write or not isinstance(value, torch.fx.Node):
                continue
            source = _viewed(value)
            if source.name in buffers:
                found.add(buffers[source.name])
    return found


def _viewed(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor ``node`` is a view of (itself when it is no view)."""
    for _ in range(64):
        schema = getattr(node.target, "_schema", None)
        first = node.args[0] if node.args else None
        if (
            node.op != "call_function"
            or schema is None
            or not schema.arguments
            or schema.arguments[0].alias_info is None
            or not isinstance(first, torch.fx.Node)
        ):
            return node
        node = first
    return node


def check_grid_math(grid_math: object) -> str:
    """``grid_math`` checked: "float" (the coordinate arithmetic between the last compute-heavy
    op and each grid sampler's grid input in float) or "int" (quantized too)."""

    if grid_math not in GRID_MATHS:
        raise ValueError(
            f"grid_math must be one of {', '.join(map(repr, GRID_MATHS))}, got {grid_math!r}"
        )
    return str(grid_math)


def check_qspec_list(
    qspecs: Sequence[QuantizationSpec | None] | None, what: str
) -> tuple[QuantizationSpec | None, ...] | None:
    if qspecs is None:
        return None
    if isinstance(qspecs, QuantizationSpec) or not isinstance(qspecs, Sequence):
        raise TypeError(f"{what} must be a sequence of qspecs (or None), one per boundary")
    return tuple(qspecs)


def refuse_unsigned(quant: QuantOptions) -> None:
    """uint8 (UNORM8) qspecs are refused: ExecuTorch 1.5.1's XNNPACK serializer writes every
    8-bit per-tensor type as qint8 (UNORM8 values past 127 are clipped, silently), its VGF
    lowering has no uint8 PAD or boundaries, and the grid-sampler blob holds int8 and int16."""
    named = [
        *(("input", k, q) for k, q in enumerate(quant.inputs or ())),
        *(("output", k, q) for k, q in enumerate(quant.outputs or ())),
        *(
            (f"grid sampler {role}", None, q)
            for role, q in (
                ("image", quant.sampler_image),
                ("grid", quant.sampler_grid),
                ("output", quant.sampler_output),
            )
        ),
    ]
    for what, index, qspec in named:
        if isinstance(qspec, QuantizationSpec) and qspec.dtype == torch.uint8:
            where = what if index is None else f"{what} {index}"
            raise ValueError(
                f"{where} asks for uint8 (unorm8): ExecuTorch 1.5.1 computes uint8 tensors wrongly "
                "in XNNPACK and cannot lower them for VGF; use snorm8 (an image in [0, 1] keeps "
                "128 levels) or leave it to the calibrated default"
            )
