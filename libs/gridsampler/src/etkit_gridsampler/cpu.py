"""The CPU kernel (C++), called from Python."""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any, Literal

import numpy as np
import torch
from torch._subclasses.fake_tensor import is_fake

from etkit_gridsampler._library import native_library
from etkit_gridsampler.op import MODE_CODES, PADDING_CODES, GridSampleOp, QParams
from etkit_gridsampler.plan import UnsupportedOpError, c_qparams, unsupported_reason

Isa = Literal["auto", "scalar", "avx2", "avx512", "neon"]
# The C API's codes (etkit_gridsampler_best_isa); every instruction set computes the same bits.
_ISA_CODES: dict[str, int] = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3, "neon": 4}
# Which CPUs have each vectorized kernel, for the message that refuses one this CPU lacks.
_ISA_HOMES: dict[str, str] = {
    "avx2": "x86-64 CPUs with AVX2 and FMA",
    "avx512": "x86-64 CPUs with AVX-512 F, BW, DQ, VL, VBMI and VNNI",
    "neon": "AArch64 CPUs (Advanced SIMD)",
}
# num_threads travels as a C int; far more threads than CPUs only costs.
_MAX_THREADS = 4096


@cache
def available_isas() -> tuple[str, ...]:
    """The instruction sets the integer kernel can use on this CPU, best last: on x86-64 a prefix
    of ``("scalar", "avx2", "avx512")`` ("avx512": F, BW, DQ, VL, VBMI and VNNI), on AArch64
    ``("scalar", "neon")``, elsewhere ``("scalar",)``. AVX-512 serves both modes, every padding,
    planar (NCHW, or one channel) images of any channel count and channels-last images of 2, 3,
    4, 8 or a multiple of 16 channels, each into an output of its image's layout; AVX2 the same,
    and bilinear channels-last images of any channel count from 2 (only nearest sampling keeps
    to those counts); NEON every mode, padding, channel count and layout. Other configurations
    (sides of 2^15 pixels or more; on x86 also bilinear images 1 pixel wide, and channels-last
    ones 1 pixel high) run the scalar
    kernel, whatever ``isa`` says; every kernel computes the same bits."""
    library = native_library()
    return tuple(
        name
        for name, code in _ISA_CODES.items()
        if code > 0 and library.etkit_gridsampler_cpu_supports(code)
    )


def _int64_array(values: tuple[int, ...] | torch.Size) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


def default_num_threads() -> int:
    """The threads ``grid_sample`` uses for the integer kernel when ``num_threads`` is 0: the CPUs
    this process may run on now (its affinity mask, as ``taskset``, ``os.sched_setaffinity`` and
    cpusets set it), at most its cgroup's CPU quota (read once per process) rounded up, at least
    1. Smaller outputs use fewer: about one thread per 64k output pixels."""
    return int(native_library().etkit_gridsampler_default_num_threads())


_SHAPES = {"image": "N x C x H x W", "grid": "N x Ho x Wo x 2"}


def check_op(op: object) -> GridSampleOp:
    """Raises ``TypeError`` unless ``op`` is a ``GridSampleOp``."""
    if not isinstance(op, GridSampleOp):
        raise TypeError(
            f"op must be an etkit_gridsampler.GridSampleOp, got {type(op).__module__}."
            f"{type(op).__qualname__}; build one with GridSampleOp(mode=..., padding_mode=..., "
            "align_corners=...)"
        )
    return op


def _check_tensor(value: object, name: str) -> torch.Tensor:
    """Raises unless ``value`` is a dense CPU tensor with its data in memory, naming ``name``."""
    shape = _SHAPES[name]
    if not isinstance(value, torch.Tensor):
        hint = (
            f"; convert it with torch.from_numpy({name})" if isinstance(value, np.ndarray) else ""
        )
        raise TypeError(
            f"{name} must be a torch.Tensor ({shape}), got {type(value).__module__}."
            f"{type(value).__qualname__}{hint}"
        )
    if value.is_nested:
        raise ValueError(f"{name} must be a dense {shape} tensor, got a nested tensor")
    if value.layout != torch.strided:
        raise ValueError(
            f"{name} must be a dense (torch.strided) tensor, got layout {value.layout}; convert "
            f"it with {name}.to_dense()"
        )
    if value.device.type != "cpu":
        why = " (a meta tensor has no data to sample)" if value.device.type == "meta" else ""
        raise ValueError(
            f"{name} must be a CPU tensor, got one on {value.device}{why}; pass {name}.cpu() "
            "or a tensor made on the CPU"
        )
    if is_fake(value):
        raise ValueError(
            f"{name} is a FakeTensor (from tracing or torch.compile), which has no data to "
            "sample; pass a real CPU tensor"
        )
    return value


def _check_storage(tensor: torch.Tensor, name: str) -> None:
    """Raises unless ``tensor``'s storage holds every element its shape and strides reach."""
    reach = tensor.storage_offset() + sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    needed = (reach + 1) * tensor.element_size()
    storage = tensor.untyped_storage()
    if storage.nbytes() < needed or storage.data_ptr() == 0:
        raise ValueError(
            f"{name}'s storage holds {storage.nbytes()} bytes, but its shape "
            f"{tuple(tensor.shape)}, strides {tensor.stride()} and storage offset "
            f"{tensor.storage_offset()} reach {needed} bytes (a storage resized or freed?); "
            "pass a tensor whose storage holds its elements"
        )


def _check_dtypes(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> None:
    if op.is_float:
        for name, tensor in (("image", image), ("grid", grid)):
            if tensor.dtype != torch.float32:
                raise ValueError(
                    f"{name} must be torch.float32 for a float GridSampleOp (image, grid and "
                    f"output QParams None), got {tensor.dtype}; convert it with {name}.float(), "
                    "or give the op QParams for quantized tensors"
                )
        return
    # What makes the op unsupported whatever the image's size (its dtypes, its requantization):
    # a 1 x 1 image asks the least of the coordinate range.
    reason = unsupported_reason(op, 1, 1)
    if reason is not None:
        raise UnsupportedOpError(reason)
    for name, tensor, qparams in (("image", image, op.image), ("grid", grid, op.grid)):
        assert qparams is not None  # unsupported_reason says so otherwise
        if tensor.dtype != qparams.dtype:
            raise ValueError(
                f"{name} must be {qparams.dtype}: op quantizes the {name} to {qparams.dtype}; "
                f"got {tensor.dtype}. Quantize it with op.{name} first (or pass a float op)"
            )


def _check_shapes(image: torch.Tensor, grid: torch.Tensor) -> None:
    if image.dim() != 4:
        raise ValueError(f"image must be N x C x H x W (4-D), got shape {tuple(image.shape)}")
    if grid.dim() != 4 or grid.shape[-1] != 2:
        raise ValueError(
            f"grid must be N x Ho x Wo x 2 (4-D, (x, y) last), got shape {tuple(grid.shape)}"
        )
    if grid.shape[0] != image.shape[0]:
        raise ValueError(
            f"image and grid must have the same batch size N, got image N = {image.shape[0]} "
            f"(shape {tuple(image.shape)}) and grid N = {grid.shape[0]} "
            f"(shape {tuple(grid.shape)})"
        )
    for name, tensor in (("image", image), ("grid", grid)):
        if min(tensor.shape) < 1:
            raise ValueError(
                f"{name} must have every size at least 1 ({_SHAPES[name]}), got shape "
                f"{tuple(tensor.shape)}"
            )


def check_inputs(image: object, grid: object, op: object | None = None) -> torch.dtype | None:
    """Checks the operands of a grid sampler before any kernel touches them, in this order:
    that ``op`` is a ``GridSampleOp``, that ``image`` and ``grid`` are dense CPU tensors with
    data (``TypeError`` for a non-tensor, ``ValueError`` for a sparse, nested, meta, fake or
    non-CPU one), their dtypes against ``op`` (float32 for a float op, ``op.image.dtype`` and
    ``op.grid.dtype`` for a quantized one), their shapes (image N x C x H x W, grid
    N x Ho x Wo x 2, the same N, no size 0), that ``op`` is inside the contract for this image
    (``UnsupportedOpError``, a ``ValueError``) and that their storage holds their elements.
    Every message names the argument and what it should be. Returns the output dtype when
    ``op`` is given."""
    if op is not None:
        check_op(op)
    image_t = _check_tensor(image, "image")
    grid_t = _check_tensor(grid, "grid")
    if isinstance(op, GridSampleOp):
        _check_dtypes(image_t, grid_t, op)
    _check_shapes(image_t, grid_t)
    if isinstance(op, GridSampleOp) and not op.is_float:
        reason = unsupported_reason(op, image_t.shape[2], image_t.shape[3])
        if reason is not None:
            raise UnsupportedOpError(reason)
    _check_storage(image_t, "image")
    _check_storage(grid_t, "grid")
    if not isinstance(op, GridSampleOp):
        return None
    if op.is_float or op.output is None:
        return torch.float32
    return op.output.dtype


def check_dtypes(image: torch.Tensor, grid: torch.Tensor, op: GridSampleOp) -> torch.dtype:
    """``check_inputs`` with an op: raises as it does; returns the output dtype."""
    output_dtype = check_inputs(image, grid, op)
    assert output_dtype is not None
    return output_dtype


def is_channels_last(image: torch.Tensor) -> bool:
    """True when ``image`` is NHWC in memory (and not also plain contiguous, as when C == 1)."""
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image must be a torch.Tensor, got {type(image).__name__}")
    return (
        bool(image.is_contiguous(memory_format=torch.channels_last)) and not image.is_contiguous()
    )


def _output_like(image: torch.Tensor, grid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    channels_last = is_channels_last(image)
    return torch.empty(
        (image.shape[0], image.shape[1], grid.shape[1], grid.shape[2]),
        dtype=dtype,
        memory_format=torch.channels_last if channels_last else torch.contiguous_format,
    )


def _check_run_arguments(num_threads: int, isa: Isa) -> None:
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise TypeError(f"num_threads must be an int (0: the default), got {num_threads!r}")
    if not 0 <= num_threads <= _MAX_THREADS:
        raise ValueError(
            f"num_threads must be 0 (default_num_threads(), now {default_num_threads()}) or a "
            f"count up to {_MAX_THREADS}, got {num_threads}"
        )
    if isa not in _ISA_CODES or (isa != "auto" and isa not in available_isas()):
        why = (
            f" (not available on this CPU: {_ISA_HOMES[isa]} have it)" if isa in _ISA_HOMES else ""
        )
        raise ValueError(
            f"isa must be 'auto' or one of {available_isas()} on this CPU, got {isa!r}{why}"
        )


def grid_sample(
    image: torch.Tensor,
    grid: torch.Tensor,
    op: GridSampleOp,
    *,
    num_threads: int = 0,
    isa: Isa = "auto",
) -> torch.Tensor:
    """Samples ``image`` (N x C x H x W, contiguous or channels-last) at ``grid`` (N x Ho x Wo x 2)
    as ``op`` says; the output has the image's memory format.

    Float ``op``: float32 tensors, within 1e-5 of PyTorch. Quantized ``op``: an int8 image, an
    int16 or int8 grid (the dtypes of ``op.image`` and ``op.grid``), int8 output when
    ``op.output`` is set, float32 otherwise, by the integer contract of docs/contract.md.
    ``num_threads``: 0 for ``default_num_threads()`` (the CPUs this process may use; the
    integer kernel: the float one uses one thread).
    ``isa``: the integer kernel's instruction set, ``"auto"`` for the best in
    ``available_isas()``; all give the same bits (``"scalar"`` is there to check that).

    Raises (``check_inputs``) before any kernel runs: ``TypeError`` for an argument of the wrong
    type, ``ValueError`` for a tensor, ``num_threads`` or ``isa`` that does not fit, and
    ``UnsupportedOpError`` (a ``ValueError``) for a configuration outside the contract."""
    output_dtype = check_dtypes(image, grid, op)
    _check_run_arguments(num_threads, isa)
    # A negated view (neg bit) keeps its data un-negated in memory: the kernel reads memory.
    image, grid = image.resolve_neg(), grid.resolve_neg()
    output = _output_like(image, grid, output_dtype)
    library = native_library()
    if op.is_float:
        status = library.etkit_gridsampler_grid_sample_f32(
            image.data_ptr(), _int64_array(image.shape), _int64_array(image.stride()),
            grid.data_ptr(), _int64_array(grid.shape), _int64_array(grid.stride()),
            output.data_ptr(), _int64_array(output.stride()),
            MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"the native kernel rejected the arguments of {op}")
        return output
    return _run_quantized(
        library.etkit_gridsampler_grid_sample_q, image, grid, op, output, num_threads, isa
    )


def grid_sample_float_grid(
    image: torch.Tensor,
    grid: torch.Tensor,
    op: GridSampleOp,
    *,
    num_threads: int = 0,
    isa: Isa = "auto",
) -> torch.Tensor:
    """``grid_sample`` of a quantized ``op`` whose grid arrives as float32 and is quantized with
    ``op.grid`` as it is sampled, chunk by chunk on the kernel's threads: what the delegate of
    a blob whose grid arrives as float32 runs (the quantize before a sampler, fused). The output
    is ``grid_sample(image, op.quantize_per_tensor(grid, op.grid), op)``, bit for bit. Raises as
    ``grid_sample`` does, and ``ValueError`` for a float op or a grid that is not float32."""
    check_op(op)
    grid_t = _check_tensor(grid, "grid")
    if op.grid is None or op.is_float:
        raise ValueError(
            "grid_sample_float_grid needs a quantized op: its grid QParams say how to quantize "
            "the float32 grid (a float op samples a float grid with grid_sample)"
        )
    if grid_t.dtype != torch.float32:
        raise ValueError(
            f"grid must be torch.float32 (it is quantized with op.grid on entry), got "
            f"{grid_t.dtype}; pass a quantized grid to grid_sample"
        )
    _check_storage(grid_t, "grid")
    # The quantized grid's checks, on a view of one element (no copy): dtypes, shapes, contract.
    output_dtype = check_dtypes(
        image, torch.zeros((), dtype=op.grid.dtype).expand(grid_t.shape), op
    )
    _check_run_arguments(num_threads, isa)
    image, grid_t = image.resolve_neg(), grid_t.resolve_neg()
    output = _output_like(image, grid_t, output_dtype)
    library = native_library()
    return _run_quantized(
        library.etkit_gridsampler_grid_sample_q_float_grid,
        image,
        grid_t,
        op,
        output,
        num_threads,
        isa,
    )


def _run_quantized(
    entry: Any,
    image: torch.Tensor,
    grid: torch.Tensor,
    op: GridSampleOp,
    output: torch.Tensor,
    num_threads: int,
    isa: Isa,
) -> torch.Tensor:
    assert op.grid is not None
    image_q, grid_q, output_q = (c_qparams(q) for q in (op.image, op.grid, op.output))
    error = ctypes.c_char_p()
    status = entry(
        image.data_ptr(), _int64_array(image.shape), _int64_array(image.stride()),
        grid.data_ptr(), int(op.grid.dtype == torch.int8), _int64_array(grid.shape),
        _int64_array(grid.stride()),
        output.data_ptr(), _int64_array(output.stride()),
        MODE_CODES[op.mode], PADDING_CODES[op.padding_mode], int(op.align_corners),
        ctypes.byref(image_q) if image_q else None,
        ctypes.byref(grid_q) if grid_q else None,
        ctypes.byref(output_q) if output_q else None,
        num_threads, _ISA_CODES[isa], ctypes.byref(error),
    )  # fmt: skip
    if status != 0:
        raise UnsupportedOpError(error.value.decode() if error.value else "unsupported op")
    return output


def quantize_grid(values: torch.Tensor, qparams: QParams, *, isa: Isa = "auto") -> torch.Tensor:
    """``values`` (float32) quantized by the C++ kernel as the delegate quantizes a grid on
    entry (``op.quantize_per_tensor`` is the same in PyTorch): for tests and the curious."""
    if not isinstance(values, torch.Tensor) or values.dtype != torch.float32:
        raise ValueError(f"values must be a float32 tensor, got {values!r:.60}")
    _check_run_arguments(0, isa)
    values = values.contiguous()
    out = torch.empty(values.shape, dtype=qparams.dtype)
    q = c_qparams(qparams)
    assert q is not None
    status = native_library().etkit_gridsampler_quantize_grid(
        values.data_ptr(),
        values.numel(),
        ctypes.byref(q),
        int(qparams.dtype == torch.int8),
        out.data_ptr(),
        _ISA_CODES[isa],
    )
    if status != 0:
        raise ValueError(f"the native kernel refused to quantize with {qparams}")
    return out
