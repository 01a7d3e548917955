"""Sizes: one export for several input sizes (issue 38).

``sizes=[(540, 960), (720, 1280)]`` (enumerated: one method per size, each captured at its size,
``forward`` the first) or ``dynamic_size=((256, 1088), (256, 1920), 64)`` (a range: one method,
captured once with ``torch.export`` dynamic dimensions on the height and width of every image
input, each a multiple of 64 within the bounds). The image inputs are the model's inputs whose
last two dimensions are the example's height and width (those of its first input of rank 4); the
others keep their shapes at every size. Everything here is checked before any work: a malformed
size, both options at once, a range for a target without dynamic shapes (VGF), an example
outside the range or not a multiple of it, a size the model's forward cannot take, calibration
samples of a size the export does not cover (``calibration_reference``, ``calibrated_at``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Final, TypedDict

import torch
import torch.nn.functional as F

from etkit_exporter.core.diagnostics import exception_chain, root_cause
from etkit_quant import observe_ranges

Size = tuple[int, int]

# The targets whose runtime runs one method at every size within bounds (XNNPACK: bounded
# dynamic shapes; etkit's grid-sampler delegate, format version 3). A VGF is compiled for one
# size: model-converter 0.11 has no dynamic dimensions.
DYNAMIC_TARGETS: Final = ("xnnpack",)
# the enumerated route's method names: forward_540x960
METHOD_PREFIX: Final = "forward_"
# How the example inputs are brought to another size (images: bilinear; integers: nearest).
_RESIZE_MODE: Final = "bilinear"
# A range calibrated on samples of several sizes is refused when a boundary's observed range
# (an input, an output, a grid sampler's image, grid or output) spans more than this many times
# as much at one size as at another: one set of parameters would serve one of them badly. (A
# flow in pixels doubles with the size: 4x between 270 and 1080 rows is still a fair sample.)
RANGE_DISAGREEMENT: Final = 8.0


class SizeError(ValueError):
    """A size option that cannot be honoured, said in one line (a usage error)."""


@dataclass(frozen=True)
class SizeRange:
    """Heights ``height[0]..height[1]`` and widths ``width[0]..width[1]``, each a multiple of
    ``multiple``."""

    height: Size
    width: Size
    multiple: int = 1

    def text(self) -> str:
        """As ``--dynamic-size`` takes it: ``256-1088x256-1920/64``."""
        suffix = f"/{self.multiple}" if self.multiple != 1 else ""
        return f"{self.height[0]}-{self.height[1]}x{self.width[0]}-{self.width[1]}{suffix}"

    def outside(self, size: Size) -> str | None:
        """Why ``size`` is not one of the range's sizes; ``None`` when it is."""
        for axis, value, (low, high) in (
            ("height", size[0], self.height),
            ("width", size[1], self.width),
        ):
            if not low <= value <= high:
                return f"its {axis} {value} is outside {low}..{high}"
            if value % self.multiple:
                return f"its {axis} {value} is not a multiple of {self.multiple}"
        return None

    def verification_sizes(self, example: Size) -> list[Size]:
        """The sizes ``--verify`` runs the program at: the smallest, one odd size in between
        (neither bound nor the example, and as unround as the multiple allows), the largest and
        the example."""
        m = self.multiple

        def between(low: int, high: int, avoid: int) -> int:
            steps = (high - low) // m
            for k in (steps // 2 + 1, steps // 2, steps // 3 + 1, 1):
                value = low + k * m
                if low < value < high and value != avoid:
                    return value
            return low

        odd = (
            between(self.height[0], self.height[1], example[0]),
            between(self.width[0], self.width[1], example[1]),
        )
        chosen = [(self.height[0], self.width[0]), odd, (self.height[1], self.width[1]), example]
        return list(dict.fromkeys(chosen))


@dataclass(frozen=True)
class SizePlan:
    """The sizes an export covers: ``enumerated`` (one method each, ``forward`` the first) or
    ``dynamic`` (one method over the range); ``example`` is the example inputs' size and
    ``image_inputs`` the indices of the inputs that take each size."""

    example: Size
    image_inputs: tuple[int, ...]
    enumerated: tuple[Size, ...] = ()
    dynamic: SizeRange | None = None
    # the size the calibration samples are of (enumerated: one of the listed sizes or the
    # example's; ``None``: the example's); a range takes samples of any of its sizes
    calibration: Size | None = None

    @property
    def calibrated(self) -> Size:
        """The size calibration runs at: the enumerated methods' observer states come from it."""
        return self.calibration or self.example

    def methods(self) -> list[tuple[str, Size]]:
        """Each method with its size: ``forward`` (the first size: what every tool runs), then
        ``forward_HxW`` for each other size."""
        if not self.enumerated:
            return [("forward", self.example)]
        first, *others = self.enumerated
        return [("forward", first)] + [(method_name(size), size) for size in others]

    def as_dict(self) -> dict[str, Any]:
        """report.json's ``sizes``."""
        section: dict[str, Any] = {
            "example": size_text(self.example),
            "image_inputs": list(self.image_inputs),
        }
        if self.dynamic is not None:
            section["dynamic"] = {
                "height": list(self.dynamic.height),
                "width": list(self.dynamic.width),
                "multiple": self.dynamic.multiple,
                "text": self.dynamic.text(),
            }
        else:
            section["methods"] = {name: size_text(size) for name, size in self.methods()}
        return section


def size_text(size: Size) -> str:
    return f"{size[0]}x{size[1]}"


def method_name(size: Size) -> str:
    return f"{METHOD_PREFIX}{size[0]}x{size[1]}"


_SIZE: Final = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")
_RANGE: Final = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*[xX]\s*(\d+)\s*-\s*(\d+)\s*(?:/\s*(\d+)\s*)?")


def parse_sizes(text: str) -> list[Size]:
    """``540x960,720x1280`` as sizes; ``SizeError`` naming the part that is not ``HxW``."""
    sizes = []
    for part in text.split(","):
        match = _SIZE.fullmatch(part)
        if match is None:
            raise SizeError(
                f"--sizes {text!r}: {part.strip()!r} is not a size HxW (e.g. 540x960,720x1280)"
            )
        sizes.append((int(match[1]), int(match[2])))
    return sizes


def parse_dynamic_size(text: str) -> tuple[Size, Size, int]:
    """``256-1088x256-1920/64`` as (heights, widths, multiple); ``SizeError`` when malformed."""
    match = _RANGE.fullmatch(text)
    if match is None:
        raise SizeError(
            f"--dynamic-size {text!r} is not a range HMIN-HMAXxWMIN-WMAX[/MULTIPLE] "
            "(e.g. 256-1088x256-1920/64)"
        )
    multiple = int(match[5]) if match[5] is not None else 1
    return (int(match[1]), int(match[2])), (int(match[3]), int(match[4])), multiple


def _size(value: object, what: str) -> Size:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise SizeError(f"{what} must be a (height, width) pair of ints, got {value!r}")
    height, width = int(value[0]), int(value[1])
    if height < 1 or width < 1:
        raise SizeError(f"{what} {height}x{width} has a side below 1")
    return height, width


def size_range(value: object) -> SizeRange:
    """``value`` (``((min height, max height), (min width, max width)[, multiple])``) as a
    ``SizeRange``, checked (``SizeError``, one line)."""
    return _range(value)


def _range(value: object) -> SizeRange:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) not in (2, 3):
        raise SizeError(
            "a size range is ((min height, max height), (min width, max width)[, multiple]), "
            f"got {value!r}"
        )
    height = _size(value[0], "the size range's heights")
    width = _size(value[1], "the size range's widths")
    multiple = value[2] if len(value) == 3 else 1
    if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
        raise SizeError(f"the size range's multiple must be a positive int, got {multiple!r}")
    chosen = SizeRange(height, width, multiple)
    for axis, (low, high) in (("height", height), ("width", width)):
        if low > high:
            raise SizeError(
                f"size range {chosen.text()}: its {axis}s run from {low} down to {high}"
            )
        for bound in (low, high):
            if bound % multiple:
                raise SizeError(
                    f"size range {chosen.text()}: the {axis} bound {bound} is not a multiple of "
                    f"{multiple}; give bounds that are (e.g. "
                    f"{-(-low // multiple) * multiple}-{high // multiple * multiple})"
                )
    return chosen


def image_inputs(inputs: Sequence[torch.Tensor]) -> tuple[Size, tuple[int, ...]]:
    """The example size (the last two dimensions of the first input of rank 4) and the indices
    of the inputs of that height and width; ``SizeError`` when no input is an image."""
    first = next((x for x in inputs if x.dim() == 4), None)
    if first is None:
        raise SizeError("sizes apply to image inputs (N x C x H x W): the model has no 4-D input")
    example = (int(first.shape[-2]), int(first.shape[-1]))
    chosen = tuple(
        k for k, x in enumerate(inputs) if x.dim() >= 3 and tuple(x.shape[-2:]) == example
    )
    return example, chosen


def check_sizes(
    sizes: object,
    dynamic_size: object,
    inputs: Sequence[torch.Tensor],
    target: str,
    *,
    qat: bool = False,
) -> SizePlan | None:
    """The sizes an export covers, checked before any work (``SizeError``, one line); ``None``
    when neither option is given. ``qat``: the model was trained with QAT (its sizes are those
    ``qat_prepare`` captured it for: its forward refuses any other, ``check_forward_at_sizes``)."""
    if sizes is None and dynamic_size is None:
        return None
    if sizes is not None and dynamic_size is not None:
        raise SizeError(
            "give a list of sizes (one method each) or a size range (one method over it), not both"
        )
    example, images = image_inputs(inputs)
    if dynamic_size is not None:
        chosen = _range(dynamic_size)
        if target not in DYNAMIC_TARGETS:
            raise SizeError(
                f"size range {chosen.text()}: target {target!r} has no dynamic sizes "
                "(model-converter 0.11 compiles a VGF for one size); give a list of sizes, one "
                f"method each (e.g. {suggested_sizes(chosen)})"
            )
        why = chosen.outside(example)
        if why is not None:
            raise SizeError(
                f"size range {chosen.text()}: the example inputs' size {size_text(example)} is "
                f"not in the range ({why}); give example inputs of a size within it"
            )
        return SizePlan(example, images, dynamic=chosen)
    if isinstance(sizes, str) or not isinstance(sizes, Sequence) or not sizes:
        raise SizeError(f"sizes must be a non-empty list of (height, width) pairs, got {sizes!r}")
    listed = [_size(value, f"sizes[{k}]") for k, value in enumerate(sizes)]
    repeated = next((s for k, s in enumerate(listed) if s in listed[:k]), None)
    if repeated is not None:
        raise SizeError(f"sizes lists {size_text(repeated)} twice")
    return SizePlan(example, images, enumerated=tuple(listed))


def suggested_sizes(chosen: SizeRange) -> str:
    """A few sizes of ``chosen`` for the enumerated route: its ends and one between (a
    multiple of the range's, or of 16)."""
    step = chosen.multiple if chosen.multiple > 1 else 16

    def middle(low: int, high: int) -> int:
        return min(max((low + high) // 2 // step * step, low), high)

    between = (middle(*chosen.height), middle(*chosen.width))
    sizes = [(chosen.height[0], chosen.width[0]), between, (chosen.height[1], chosen.width[1])]
    return ",".join(size_text(s) for s in dict.fromkeys(sizes))


def resize_inputs(
    inputs: Sequence[torch.Tensor], plan: SizePlan, size: Size
) -> tuple[torch.Tensor, ...]:
    """``inputs`` with each image input brought to ``size`` (float: bilinear; integers:
    nearest); the example inputs themselves at the example size."""
    if size == plan.example:
        return tuple(inputs)
    resized = []
    for k, value in enumerate(inputs):
        if k not in plan.image_inputs:
            resized.append(value)
            continue
        shape = value.shape
        flat = value.reshape(-1, 1, *shape[-2:])
        if value.dtype.is_floating_point:
            out = F.interpolate(flat, size=size, mode=_RESIZE_MODE, align_corners=False)
        else:
            out = F.interpolate(flat.float(), size=size, mode="nearest").to(value.dtype)
        resized.append(out.reshape(*shape[:-2], *size).contiguous())
    return tuple(resized)


def _sample_size(sample: Sequence[torch.Tensor], plan: SizePlan) -> Size | None:
    image = sample[plan.image_inputs[0]] if plan.image_inputs else None
    if image is None or image.dim() < 3:
        return None
    return (int(image.shape[-2]), int(image.shape[-1]))


def calibration_reference(
    inputs: Sequence[torch.Tensor], plan: SizePlan | None
) -> Callable[[int, tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] | None:
    """``check_calibration``'s ``reference_for`` for an export of several sizes (``None``
    without sizes): a sample may be of any size the export covers (a listed size or the
    example's; a range: any size in it), and is checked against the example inputs brought to
    its size. A sample of another size is ``SizeError``, naming it."""
    if plan is None:
        return None
    references: dict[Size, tuple[torch.Tensor, ...]] = {}

    def reference_for(index: int, sample: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        size = _sample_size(sample, plan)
        if size is None:  # not an image where the example has one: the shape check says so
            return tuple(inputs)
        if plan.dynamic is not None:
            why = plan.dynamic.outside(size)
            covered = f"the range {plan.dynamic.text()}"
        else:
            why = None if size in (*plan.enumerated, plan.example) else "it is not listed"
            covered = ", ".join(size_text(s) for s in plan.enumerated)
        if why is not None:
            raise SizeError(
                f"calibration sample {index} is {size_text(size)}, a size this export does not "
                f"cover ({why}); give samples of its sizes ({covered})"
            )
        if size not in references:
            references[size] = resize_inputs(inputs, plan, size)
        return references[size]

    return reference_for


def calibrated_at(
    plan: SizePlan | None, samples: Sequence[Sequence[torch.Tensor]]
) -> SizePlan | None:
    """``plan`` with the size its (checked) calibration ``samples`` are of. An enumerated export
    is calibrated once, at one size, whose observed ranges (per tensor, not per pixel) serve
    every size: samples of several sizes are ``SizeError``. A range calibrates its one capture
    on samples of any of its sizes."""
    if plan is None or plan.dynamic is not None:
        return plan
    sizes = list(dict.fromkeys(s for s in (_sample_size(x, plan) for x in samples) if s))
    if len(sizes) > 1:
        raise SizeError(
            f"calibration samples of {len(sizes)} sizes ({', '.join(map(size_text, sizes))}): "
            "an enumerated export is calibrated at one size, whose ranges serve every size; "
            "give every sample at one of its sizes"
        )
    return replace(plan, calibration=sizes[0]) if sizes and sizes[0] != plan.example else plan


def check_ranges_agree(
    program: Any, samples: Sequence[tuple[torch.Tensor, ...]], plan: SizePlan | None
) -> None:
    """A range calibrated on samples of several sizes: each size's samples are observed on its
    float ``program`` alone (``etkit_quant.observe_ranges``), and a boundary whose range spans
    more than ``RANGE_DISAGREEMENT`` times as much at one size as at another is ``SizeError``,
    naming it, the two sizes and their ranges."""
    if plan is None or plan.dynamic is None:
        return
    groups: dict[Size, list[tuple[torch.Tensor, ...]]] = {}
    for sample in samples:
        groups.setdefault(_sample_size(sample, plan) or plan.example, []).append(sample)
    if len(groups) < 2:
        return
    observed = {size: observe_ranges(program, group).ranges for size, group in groups.items()}
    for k, site in enumerate(next(iter(observed.values()))):
        spans = {size: ranges[k].max - ranges[k].min for size, ranges in observed.items()}
        narrow, wide = min(spans, key=spans.__getitem__), max(spans, key=spans.__getitem__)
        if not 0 < spans[narrow] < spans[wide] / RANGE_DISAGREEMENT:
            continue
        a, b = observed[narrow][k], observed[wide][k]
        raise SizeError(
            f"calibration samples of {size_text(narrow)} and {size_text(wide)} disagree wildly "
            f"on {site.name}: [{a.min:.4g}, {a.max:.4g}] against [{b.min:.4g}, {b.max:.4g}] "
            f"({spans[wide] / spans[narrow]:.0f}x the span, more than {RANGE_DISAGREEMENT:g}x): "
            "one set of quantization parameters would serve one size badly; calibrate with "
            "samples alike at every size, or export the sizes apart"
        )


def check_forward_at_sizes(
    model: torch.nn.Module, inputs: Sequence[torch.Tensor], plan: SizePlan | None
) -> None:
    """Runs the float model at every size it is exported for (a range: its smallest and largest
    size) before any work, so that a size the model cannot take (not a multiple of its pyramid)
    is one line (``SizeError``) naming the size and the model's own error."""
    if plan is None:
        return
    if plan.dynamic is not None:
        bounds = plan.dynamic
        sizes = [(bounds.height[0], bounds.width[0]), (bounds.height[1], bounds.width[1])]
    else:
        sizes = list(plan.enumerated)
    for size in sizes:
        if size == plan.example:
            continue
        try:
            with torch.no_grad():
                model(*resize_inputs(inputs, plan, size))
        except Exception as error:
            raise SizeError(
                f"the model cannot take size {size_text(size)}: its forward fails there "
                f"({root_cause(error)}); give sizes it takes (e.g. multiples of its "
                "downsampling)"
            ) from error


def dynamic_shapes(plan: SizePlan | None, inputs: Sequence[torch.Tensor]) -> Any:
    """``torch.export``'s dynamic shapes for a range: the height and width (the last two
    dimensions) of every image input, one ``Dim`` each shared by all (``multiple * Dim`` for a
    multiple); the other inputs static. ``None`` (all static) without a range."""
    if plan is None or plan.dynamic is None:
        return None
    bounds = plan.dynamic
    m = bounds.multiple
    if m == 1:
        height: Any = torch.export.Dim("height", min=bounds.height[0], max=bounds.height[1])
        width: Any = torch.export.Dim("width", min=bounds.width[0], max=bounds.width[1])
    else:
        height = m * torch.export.Dim(
            "height_steps", min=bounds.height[0] // m, max=bounds.height[1] // m
        )
        width = m * torch.export.Dim(
            "width_steps", min=bounds.width[0] // m, max=bounds.width[1] // m
        )
    return tuple(
        {x.dim() - 2: height, x.dim() - 1: width} if k in plan.image_inputs else None
        for k, x in enumerate(inputs)
    )


_FRAME: Final = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n([ \t]*)(.*)\n([ \t]*)(\^+)?')
_REASON: Final = re.compile(r"^\s*- (.*)$", re.MULTILINE)
_CONSTANT: Final = re.compile(r"specialized it to be a constant \((\d+)\)")


def dynamic_capture_error(error: BaseException, plan: SizePlan) -> str | None:
    """The one line for a model whose code cannot take dynamic sizes (``torch.export`` raised a
    constraint violation: its code fixed a size, or guards it): what fixed it, where (the
    model's source line and the expression torch marked), and what to do; ``None`` for any
    other error."""
    text = next(
        (
            str(e)
            for e in reversed(exception_chain(error))  # the innermost: torch's whole text
            if "Constraints violated" in str(e) or "ConstraintViolation" in type(e).__name__
        ),
        None,
    )
    if text is None:
        return None
    where = None
    start = text.find("User stack:")
    block = text[start : text.find("\n\n", start) if "\n\n" in text[start:] else None]
    for match in _FRAME.finditer(block if start >= 0 else ""):
        path, line, function, indent, code, marks_indent, marks = match.groups()
        if "/torch/" in path or "/torch_" in path:
            continue
        expression = code.strip()
        if marks:  # the span torch marked under the code line
            offset = len(marks_indent) - len(indent)
            expression = code[offset : offset + len(marks)].strip() or expression
        # the last frame outside torch of the first violation's stack: the model's own line
        where = f"{path.rsplit('/', 1)[-1]}:{line} in {function}: {expression}"
    reasons = _REASON.findall(text)
    fixed = _CONSTANT.search(text)
    if fixed is not None:
        what = f"the model's code fixes a dynamic size to {fixed[1]}"
    elif reasons:
        what = reasons[0].split(". ")[0]
    else:
        what = "the model's code constrains its height or width"
    bounds = plan.dynamic
    span = bounds.text() if bounds is not None else "the range"
    return (
        f"the model cannot take dynamic sizes ({span}): {what}"
        + (f" at {where}" if where else "")
        + "; export a list of sizes instead (one method per size, each captured at its size), or "
        "compute that from the input's size with tensor ops"
    )


@contextmanager
def fixed_sizes_refused(plan: SizePlan | None) -> Iterator[None]:
    """Around the capture of a size range (``plan``; ``None``: nothing to do): a model whose code
    cannot take dynamic sizes (``torch.export`` raised a constraint violation, which the capture
    stage wraps) is refused with ``dynamic_capture_error``'s one line, a ``SizeError``; torch's
    own log of the guard it could not make (dozens of lines on stderr) is held back meanwhile."""
    quiet = [logging.getLogger(name) for name in _GUARD_LOGGERS] if plan is not None else []
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    except Exception as error:
        line = dynamic_capture_error(error, plan) if plan is not None else None
        if line is None:
            raise
        raise SizeError(line) from error
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


# torch's loggers that print a failed dynamic capture's guards and traceback before it raises
_GUARD_LOGGERS: Final = ("torch._guards", "torch.fx.experimental.symbolic_shapes")


def sizes_read_after_quantize(program: Any) -> list[str]:
    """In a program with dynamic sizes (an edge ``ExportedProgram``), each user input whose size
    a ``sym_size`` reads besides its one quantize gets that size read from the quantize's output
    (the same shape), the quantize moved before those reads: ExecuTorch's
    ``extract_io_quant_params`` strips an input's quantize only when it is the input's one user
    ("Input 0 has more than one users"). Returns the inputs changed."""
    graph = program.graph_module.graph
    names = set(program.graph_signature.user_inputs)
    changed = []
    for node in list(graph.nodes):
        if node.op != "placeholder" or node.name not in names:
            continue
        users = list(node.users)
        quantizes = [u for u in users if "quantize_per_tensor" in str(u.target)]
        sizes = [u for u in users if "sym_size" in str(u.target)]
        if len(quantizes) != 1 or not sizes or len(quantizes) + len(sizes) != len(users):
            continue
        (quantize,) = quantizes
        first = min(sizes, key=lambda n: list(graph.nodes).index(n))
        first.prepend(quantize)
        for size in sizes:
            size.replace_input_with(node, quantize)
        changed.append(node.name)
    if changed:
        graph.lint()
        program.graph_module.recompile()
    return changed


def size_options(sizes: str | None, dynamic_size: str | None) -> dict[str, Any]:
    """``etkit-export``'s ``--sizes`` and ``--dynamic-size`` (text; ``export.toml``'s
    ``sizes`` and ``dynamic-size``) as ``export_model``'s keywords; ``SizeError`` (one line) for
    malformed text or both given."""
    if sizes is not None and dynamic_size is not None:
        raise SizeError(
            "give --sizes (a list: one method per size) or --dynamic-size (a range: one method), "
            "not both"
        )
    options: dict[str, Any] = {}
    if sizes is not None:
        options["sizes"] = parse_sizes(sizes)
    if dynamic_size is not None:
        options["dynamic_size"] = parse_dynamic_size(dynamic_size)
    return options


class FoldLimit(TypedDict, total=False):
    """``normalize_program``'s ``max_folded_elements``, where ``fold_limit`` sets one."""

    max_folded_elements: int


def fold_limit(plan: SizePlan | None, target: str, inputs: Sequence[torch.Tensor]) -> FoldLimit:
    """``normalize_program``'s keywords for a capture at the size of ``inputs``: in an
    enumerated XNNPACK export, no folded constant of a whole image plane or more (a base grid of
    H x W positions: per-size data a program of several sizes would hold once per method) is
    made; the program computes it, and the methods share everything but their graphs (XNNPACK's
    weights are named data, stored once). A VGF keeps such constants folded: computed in the
    program they would run outside the VGF, and a VGF shares no weights anyway."""
    if plan is None or not plan.enumerated or target != "xnnpack":
        return {}
    image = inputs[plan.image_inputs[0]]
    return {"max_folded_elements": int(image.shape[-2]) * int(image.shape[-1]) - 1}
