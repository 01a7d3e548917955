"""Quantization-aware training against the exact sampler: a fake-quant grid sampler whose forward
is the device's integer arithmetic and whose backward is float ``grid_sample``'s.

``fake_quant_grid_sample(image, grid, op)`` (and the module ``ExactGridSample``) takes a float
image and a float grid, quantizes them with ``op.image`` and ``op.grid`` as the program's quantize
operators do (``quantize``), samples the integers by the contract (``torch_kernel``: torch
integer ops, so on any device, the C++ kernel's bits) and dequantizes the result with
``op.output`` as the program's dequantize does (``dequantize``; float32 output as it is): the
float value the exported program produces, exactly.

Backward (straight-through): the gradient of float ``torch.nn.functional.grid_sample`` (the op's
mode, padding and ``align_corners``; ``aten::grid_sampler_2d_backward``, what autograd runs for
it) at the dequantized operands, for the image and for the grid, with zeros where a quantization
clamped, as PyTorch's fake quantization does (``torch.fake_quantize_per_tensor_affine``):

- the image's and the grid's gradient is zero where quantizing the value clamped it to
  ``quant_min`` / ``quant_max`` (rounding alone passes the gradient through unchanged);
- the output's incoming gradient is zero where step 5 (the requantization to an int8 output)
  clamped the value; a float32 output clamps nothing.

So nearest sampling gives the image a gradient and the grid none (as float nearest
``grid_sample``), and a grid value beyond the grid quantization's range learns nothing (as behind
any fake-quant observer). The quantization parameters are constants: no gradient reaches scales
or zero points. The forward is bit-exact on every device; on CUDA the image gradient, float
``grid_sample``'s, accumulates with atomics (reproducible only under
``torch.use_deterministic_algorithms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FixedQParamsFakeQuantize

from etkit_gridsampler import torch_kernel
from etkit_gridsampler.op import (
    MODE_CODES,
    PADDING_CODES,
    GridSampleOp,
    QParams,
    quantize_per_tensor,
    rounded_per_tensor,
)
from etkit_gridsampler.plan import UnsupportedOpError
from etkit_quant import (
    QatGridSampler,
    fake_quant_params,
    prepared_grid_samplers,
    replace_grid_samplers,
)

__all__ = [
    "ExactGridSample",
    "PreparedGridSample",
    "dequantize",
    "exact_op",
    "exact_sampler",
    "fake_quant_grid_sample",
    "quantize",
    "use_exact_samplers",
]


def quantize(values: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """``values`` quantized as the program's ``quantize_per_tensor`` does
    (``op.quantize_per_tensor``): taken as float32, times the float32 ``1 / scale``, rounded
    half to even, plus the zero point, clamped to ``[quant_min, quant_max]``; ``qparams.dtype``.
    NaN gives ``quant_min``."""
    return quantize_per_tensor(values, qparams)


def dequantize(q: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """``q`` as the program's ``dequantize_per_tensor`` gives it: float32
    ``(q - zero_point) * scale``."""
    return (q.to(torch.float32) - qparams.zero_point) * qparams.scale


def _quantize_with_mask(
    values: torch.Tensor, qparams: QParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize(values, qparams)`` and where it did not clamp (the straight-through mask)."""
    rounded = rounded_per_tensor(values, qparams)
    in_range = (rounded >= qparams.quant_min) & (rounded <= qparams.quant_max)
    return rounded.clamp(qparams.quant_min, qparams.quant_max).to(qparams.dtype), in_range


def exact_op(
    *,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    image: QParams | None = None,
    grid: QParams | None = None,
    output: QParams | None = None,
) -> GridSampleOp:
    """The ``GridSampleOp`` of ``F.grid_sample(..., mode, padding_mode, align_corners)`` with
    these quantizations, checked against what the exact integer sampler mirrors. Raises
    ``ValueError`` naming the argument and what it must be."""
    if mode not in MODE_CODES:
        raise ValueError(
            f"mode must be 'bilinear' or 'nearest' (the exact integer sampler mirrors those), got "
            f"{mode!r}" + ("; the integer kernel has no bicubic" if mode == "bicubic" else "")
        )
    if padding_mode not in PADDING_CODES:
        raise ValueError(
            f"padding_mode must be one of {sorted(PADDING_CODES)}, got {padding_mode!r}"
        )
    if not isinstance(align_corners, bool):
        raise ValueError(f"align_corners must be a bool, got {align_corners!r}")
    for name, qparams in (("image", image), ("grid", grid), ("output", output)):
        if qparams is not None and not isinstance(qparams, QParams):
            raise ValueError(
                f"{name} must be an etkit_gridsampler.QParams"
                + (" or None (float32 output)" if name == "output" else "")
                + f", got {type(qparams).__name__}"
            )
    if image is None:
        raise ValueError("image must be the image's QParams (int8); the exact sampler needs them")
    if grid is None:
        raise ValueError("grid must be the grid's QParams (int16 or int8); the exact sampler "
                         "needs them")  # fmt: skip
    op = GridSampleOp(mode, padding_mode, align_corners, image, grid, output)  # type: ignore[arg-type]
    torch_kernel.check_op(op)
    return op


def _check_float(value: object, name: str) -> torch.Tensor:
    tensor = torch_kernel.check_tensor(value, name)
    if not tensor.dtype.is_floating_point:
        raise ValueError(
            f"{name} must be a floating-point tensor (the float {name}, or its fake-quantized "
            f"values), got {tensor.dtype}; for integer tensors call torch_kernel.grid_sample"
        )
    return tensor


class _FakeQuantGridSample(torch.autograd.Function):
    """The exact forward and the straight-through backward of ``fake_quant_grid_sample``."""

    @staticmethod
    def forward(
        ctx: Any, image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp
    ) -> torch.Tensor:
        assert op.image is not None and op.grid is not None
        image_q, image_in = _quantize_with_mask(image, op.image)
        grid_q, grid_in = _quantize_with_mask(grid, op.grid)
        result = torch_kernel.sample(image_q, grid_q, op, with_mask=op.output is not None)
        ctx.op = op
        ctx.dtypes = (image.dtype, grid.dtype)
        ctx.save_for_backward(image_q, grid_q, image_in, grid_in, result.in_range)
        if op.output is None:
            return result.output
        return dequantize(result.output, op.output)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        op: GridSampleOp = ctx.op
        assert op.image is not None and op.grid is not None
        image_q, grid_q, image_in, grid_in, output_in = ctx.saved_tensors
        if output_in is not None:
            grad_output = torch.where(output_in, grad_output, 0.0)
        wants_image, wants_grid = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # What autograd runs for F.grid_sample (aten::grid_sampler_2d's backward), without
        # running its forward again.
        grad_image, grad_grid = torch.ops.aten.grid_sampler_2d_backward(
            grad_output,
            dequantize(image_q, op.image),
            dequantize(grid_q, op.grid),
            MODE_CODES[op.mode],
            PADDING_CODES[op.padding_mode],
            op.align_corners,
            [wants_image, wants_grid],
        )
        return (
            torch.where(image_in, grad_image, 0.0).to(ctx.dtypes[0]) if wants_image else None,
            torch.where(grid_in, grad_grid, 0.0).to(ctx.dtypes[1]) if wants_grid else None,
            None,
        )


def fake_quant_grid_sample(
    image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp
) -> torch.Tensor:
    """What the exported program computes for ``op`` on these float operands, differentiably.

    ``image``: N x C x H x W, ``grid``: N x Ho x Wo x 2, floating point (float32 as the program
    takes them; other float dtypes are taken as float32), on one device (any). They are
    quantized with ``op.image`` and ``op.grid`` (``quantize``: already fake-quantized values
    with the same parameters come back to their integers), sampled by the integer contract and
    dequantized with ``op.output`` (float32 output when it is None). Returns float32
    N x C x Ho x Wo, in the image's memory format: the program's values bit for bit.

    Backward: float ``grid_sample``'s gradient at the dequantized operands, zero where a
    quantization clamped (the module docstring). Raises ``ValueError`` (``UnsupportedOpError``
    for the op) naming the argument and what is right."""
    op = torch_kernel.check_op(op)
    image_t, grid_t = _check_float(image, "image"), _check_float(grid, "grid")
    torch_kernel.check_pair(image_t, grid_t)
    try:
        torch_kernel.integer_plan(op, image_t.shape[2], image_t.shape[3])
    except UnsupportedOpError as error:
        raise UnsupportedOpError(
            f"op: the exact integer sampler cannot mirror {torch_kernel.describe(op)} on a "
            f"{image_t.shape[2]} x {image_t.shape[3]} image: {error}"
        ) from None
    # Function.apply is untyped in torch; it returns forward's tensor.
    result: torch.Tensor = _FakeQuantGridSample.apply(image_t, grid_t, op)  # type: ignore[no-untyped-call]
    return result


class ExactGridSample(torch.nn.Module):
    """``F.grid_sample(image, grid, mode, padding_mode, align_corners)`` as the exported program
    computes it with these quantizations (``fake_quant_grid_sample``): trainable, on any device,
    under DistributedDataParallel. No parameters of its own.

    ``ExactGridSample(image=QParams(...), grid=QParams(...), output=QParams(...) or None,
    mode=..., padding_mode=..., align_corners=...)``, or ``ExactGridSample.from_op(op)``."""

    def __init__(
        self,
        *,
        image: QParams,
        grid: QParams,
        output: QParams | None,
        mode: str = "bilinear",
        padding_mode: str = "zeros",
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        self.op = exact_op(
            mode=mode,
            padding_mode=padding_mode,
            align_corners=align_corners,
            image=image,
            grid=grid,
            output=output,
        )

    @classmethod
    def from_op(cls, op: GridSampleOp) -> ExactGridSample:
        """The module for a quantized ``op`` (``UnsupportedOpError`` when it cannot be mirrored)."""
        op = torch_kernel.check_op(op)
        assert op.image is not None and op.grid is not None
        return cls(
            image=op.image,
            grid=op.grid,
            output=op.output,
            mode=op.mode,
            padding_mode=op.padding_mode,
            align_corners=op.align_corners,
        )

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return fake_quant_grid_sample(image, grid, self.op)

    def extra_repr(self) -> str:
        return torch_kernel.describe(self.op)[len("GridSampleOp(") : -1]


# -- in a module etkit_quant.prepare_qat returned ------------------------------------------------


class PreparedGridSample(ExactGridSample):
    """The exact sampler of one grid sampler of a module ``etkit_quant.prepare_qat`` returned
    (``exact_sampler(site)``): its image, grid and output quantizations are those the fake
    quantizes around the sampler apply (``etkit_quant.fake_quant_params``; no output fake
    quantize: float32 output, as the program's sampler then writes). A fixed-parameter fake
    quantize (the SNORM presets, fixed boundaries) is read once; an observed one (a calibrated
    image or output qspec) again at every forward, since training moves its range. The fake
    quantizes are read, never owned: they stay where ``prepare_qat`` put them (no parameter,
    buffer or ``state_dict`` entry of this module's own)."""

    def __init__(self, site: QatGridSampler) -> None:
        op = _site_op(site)
        assert op.image is not None and op.grid is not None
        super().__init__(
            image=op.image,
            grid=op.grid,
            output=op.output,
            mode=op.mode,
            padding_mode=op.padding_mode,
            align_corners=op.align_corners,
        )
        self.site_name = site.name
        self._site = _Site.of(site)  # a plain attribute: not a submodule, not in state_dict
        self._observed = any(
            fq is not None and not isinstance(fq, FixedQParamsFakeQuantize)
            for fq in (site.image, site.grid, site.output)
        )

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if self._observed:
            op = _site_op(self._site)
            if op != self.op:
                self.op = op
        try:
            return fake_quant_grid_sample(image, grid, self.op)
        except UnsupportedOpError as error:
            raise UnsupportedOpError(f"grid sampler {self.site_name}: {error}") from None

    def extra_repr(self) -> str:
        return f"{self.site_name}: {super().extra_repr()}"


@dataclass(frozen=True, eq=False)
class _Site:
    """What a ``PreparedGridSample`` keeps of its ``QatGridSampler``: the sampler's settings and
    the fake quantizes it reads, not the graph's node (``copy.deepcopy`` of the prepared module
    maps these fake quantizes to their copies, as for any attribute)."""

    name: str
    image: Any
    grid: Any
    output: Any
    mode: str
    padding_mode: str
    align_corners: bool

    @classmethod
    def of(cls, site: QatGridSampler | _Site) -> _Site:
        return cls(
            site.name, site.image, site.grid, site.output, site.mode, site.padding_mode,
            site.align_corners,
        )  # fmt: skip


def exact_sampler(site: QatGridSampler) -> PreparedGridSample:
    """The exact sampler for ``site`` (a grid sampler of a prepared module,
    ``etkit_quant.prepared_grid_samplers``): ``prepare_qat``'s ``sampler_replacement`` and
    ``replace_grid_samplers``' ``replacement``. Raises ``UnsupportedOpError`` (a
    ``ValueError``), one line naming the sampler and why, for a sampler the exact integer
    sampler cannot mirror: bicubic, a float (unquantized) image or grid, an image that is not
    int8, a grid that is not int16 or int8, an output that is not int8 or float, a per-channel
    quantization, image scale / output scale past 32, or a grid scale past what the image's
    size allows."""
    if not isinstance(site, QatGridSampler):
        raise TypeError(f"site must be an etkit_quant.QatGridSampler, got {type(site).__name__}")
    module = PreparedGridSample(site)
    size = _image_size(site)
    if size is not None:
        try:
            torch_kernel.integer_plan(module.op, *size)
        except UnsupportedOpError as error:
            raise UnsupportedOpError(
                f"grid sampler {site.name}: the exact integer sampler cannot mirror "
                f"{_described(site)} on its {size[0]} x {size[1]} image: {error}"
            ) from None
    return module


def use_exact_samplers(prepared: GraphModule) -> list[str]:
    """Makes every grid sampler of ``prepared`` (a module ``etkit_quant.prepare_qat`` returned,
    trained or not) etkit's exact integer sampler (``exact_sampler``, through
    ``etkit_quant.replace_grid_samplers``): from then on its forward at each sampler is the
    program's quantize, integer kernel and dequantize, bit for bit, and its backward float
    ``grid_sample``'s straight-through gradient. Returns the names of the samplers replaced
    (one already replaced is left as it is). Every sampler is checked before any is replaced:
    one the exact sampler cannot mirror raises ``UnsupportedOpError`` naming it and why, and
    ``prepared`` is left as it was. ``etkit_quant.convert_qat`` puts the ``aten`` samplers
    back."""
    sites = [s for s in prepared_grid_samplers(prepared) if s.replacement is None]
    modules = {site.name: exact_sampler(site) for site in sites}
    return replace_grid_samplers(prepared, lambda site: modules.get(site.name))


def _described(site: QatGridSampler | _Site) -> str:
    return (
        f"mode={site.mode!r}, padding_mode={site.padding_mode!r}, "
        f"align_corners={site.align_corners}"
    )


def _site_qparams(site: _Site, role: str) -> QParams | None:
    fake_quant = getattr(site, role)
    if fake_quant is None:
        if role == "output":
            return None  # float32 output: the program's sampler writes float
        raise UnsupportedOpError(
            f"grid sampler {site.name}: its {role} is not quantized (float); the exact integer "
            f"sampler needs a quantized {role} (int8 image, int16 or int8 grid): give the "
            f"sampler an {role} qspec (the exporter's default does)"
        )
    try:
        params = fake_quant_params(fake_quant)
        return QParams(
            params.scale, params.zero_point, params.quant_min, params.quant_max, params.dtype
        )
    except (TypeError, ValueError) as error:
        raise UnsupportedOpError(
            f"grid sampler {site.name}: the exact integer sampler cannot mirror its {role} "
            f"quantization: {str(error).splitlines()[0]}"
        ) from None


def _site_op(site: QatGridSampler | _Site) -> GridSampleOp:
    """``site``'s ``GridSampleOp`` with the parameters its fake quantizes apply now."""
    if site.mode not in MODE_CODES:
        raise UnsupportedOpError(
            f"grid sampler {site.name}: the exact integer sampler cannot mirror mode="
            f"{site.mode!r} (it mirrors 'bilinear' and 'nearest'; the integer kernel has no "
            f"{site.mode}): train it with PyTorch's sampler, or use another mode"
        )
    site = _Site.of(site)
    image, grid, output = (_site_qparams(site, role) for role in ("image", "grid", "output"))
    try:
        return exact_op(
            mode=site.mode,
            padding_mode=site.padding_mode,
            align_corners=site.align_corners,
            image=image,
            grid=grid,
            output=output,
        )
    except ValueError as error:
        raise UnsupportedOpError(f"grid sampler {site.name}: {error}") from None


def _image_size(site: QatGridSampler) -> tuple[int, int] | None:
    """The height and width of the image ``site`` samples, from the graph's recorded values
    (the image fake quantize's input), or ``None`` where the graph does not record it."""
    node: object = site.node.args[0] if site.node.args else None
    for _ in range(2):
        if not isinstance(node, Node):
            return None
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.dim() == 4:
            height, width = value.shape[2], value.shape[3]
            if isinstance(height, int) and isinstance(width, int):
                return height, width
            return None  # symbolic sizes: checked at each forward
        node = node.args[0] if node.op == "call_module" and node.args else None
    return None
