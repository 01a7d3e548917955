"""Delegate calls: a registry of implementations keyed by backend id.

An implementation receives the delegate's processed bytes, its compile specs and its input
tensors and fills its output tensors. Two are built in:

- ``GridSamplerBackend``: etkit's grid sampler. The blob (``etkit_gridsampler.delegate_format``)
  says which runtime argument is the image and which the grid; the kernel is
  ``etkit_gridsampler.cpu.grid_sample`` or, for ``grid_sampler_impl="vulkan"``,
  ``etkit_gridsampler.vulkan.grid_sample`` (integer ops; a float op runs on the CPU kernel, the
  Vulkan kernel being integer-only).
- ``VgfBackend``: the processed bytes are a VGF file, run by ``scenario_runner`` on the Vulkan
  device with the ML emulation layers (``etkit_exporter.scenario.run_vgf``). As ExecuTorch's VGF
  runtime does, each input's memory (the tensor in its dim order) is copied byte for byte into
  the VGF's input of the declared dims, and each VGF output's bytes into the output tensor's
  memory; where the program's layout or dtype and the VGF's declaration disagree, the call
  copies the bytes all the same (what a device would compute) and records a warning.

A Python function ``fn(processed: bytes, compile_specs: list[CompileSpec], inputs:
list[torch.Tensor]) -> list[torch.Tensor]`` can be registered for any backend id (replacing a
built-in); its outputs must have the shapes and dtypes of the program's output tensors.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import numpy as np
import torch

from etkit_exporter.runner.errors import ExecutionError
from etkit_exporter.runner.model import DelegateInfo, TensorInfo, dtype_name

GRID_SAMPLER_BACKEND: Final = "GridSamplerBackend"
VGF_BACKEND: Final = "VgfBackend"
GridSamplerImpl = Literal["cpu", "vulkan"]
GRID_SAMPLER_IMPLS: Final = ("cpu", "vulkan")

DelegateFn = Callable[[bytes, list[Any], list[torch.Tensor]], Sequence[torch.Tensor] | torch.Tensor]


@dataclass
class DelegateCall:
    """One call of a delegate: its inputs and the output tensors to fill (in the program's
    planned memory, laid out as ``output_infos`` say), and where it is."""

    delegate: DelegateInfo
    where: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_infos: list[TensorInfo]
    output_infos: list[TensorInfo]
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.where}: delegate {self.delegate.index} ({self.delegate.backend_id})"

    def fail(self, message: str) -> ExecutionError:
        return ExecutionError(f"{self.name}: {message}")


class Backend(Protocol):
    """An implementation of a backend id."""

    def execute(self, call: DelegateCall) -> str:
        """Computes ``call.outputs`` from ``call.inputs``; returns what ran it."""


def _describe(tensor: torch.Tensor) -> str:
    return f"{dtype_name(tensor.dtype)} {list(tensor.shape)}"


class GridSamplerDelegate:
    """The grid sampler through etkit_gridsampler's kernels."""

    def __init__(self, impl: GridSamplerImpl = "cpu") -> None:
        if impl not in GRID_SAMPLER_IMPLS:
            raise ValueError(f"grid_sampler_impl must be 'cpu' or 'vulkan', got {impl!r}")
        self.impl: GridSamplerImpl = impl

    def execute(self, call: DelegateCall) -> str:
        from etkit_gridsampler import cpu, vulkan
        from etkit_gridsampler.delegate_format import DelegateFormatError, decode

        try:
            blob = decode(call.delegate.processed)
        except DelegateFormatError as error:
            raise call.fail(str(error)) from None
        roles = blob.roles
        if len(call.inputs) != roles.inputs or len(call.outputs) != 1:
            raise call.fail(
                f"the blob says {roles.inputs} inputs and 1 output, the program passes "
                f"{len(call.inputs)} and {len(call.outputs)}"
            )
        image, grid = call.inputs[roles.image], call.inputs[roles.grid]
        for role, tensor, shape in (
            ("image", image, blob.image_shape),
            ("grid", grid, blob.grid_shape),
        ):
            if tuple(tensor.shape) != tuple(shape):
                raise call.fail(
                    f"the {role} (argument {roles.image if role == 'image' else roles.grid}) is "
                    f"{_describe(tensor)}, the blob says shape {list(shape)}"
                )
        op = blob.op
        if self.impl == "vulkan" and not op.is_float:
            result = vulkan.grid_sample(image, grid, op)
            used = "etkit_gridsampler.vulkan"
        else:
            result = cpu.grid_sample(image, grid, op)
            used = "etkit_gridsampler.cpu"
            if self.impl == "vulkan":
                used += " (a float op: the Vulkan kernel is integer-only)"
        (output,) = call.outputs
        if result.shape != output.shape or result.dtype != output.dtype:
            raise call.fail(
                f"the kernel gave {_describe(result)}, the program's output is "
                f"{call.output_infos[0].describe()}"
            )
        output.copy_(result)
        return used


@dataclass(frozen=True)
class VgfTensor:
    """An input or output tensor a VGF declares."""

    dims: tuple[int, ...]
    format: str
    dtype: np.dtype[Any] | None

    @property
    def nbytes(self) -> int:
        itemsize = self.dtype.itemsize if self.dtype is not None else 0
        return int(np.prod(self.dims, dtype=np.int64)) * itemsize

    def describe(self) -> str:
        return f"{self.format} {list(self.dims)}"


@lru_cache(maxsize=64)
def _vgf_io_cached(processed: bytes) -> tuple[tuple[VgfTensor, ...], ...]:
    from etkit_exporter.scenario import FORMAT_DTYPES, scenario_template, vgf_ports

    with tempfile.TemporaryDirectory(prefix="etkit-pte-vgf-") as tmp:
        path = Path(tmp) / "model.vgf"
        path.write_bytes(processed)
        ins, outs = vgf_ports(path, scenario_template(path))
    inputs = tuple(VgfTensor(p.dims, p.format, FORMAT_DTYPES.get(p.format)) for p in ins)
    outputs = tuple(VgfTensor(p.dims, p.format, FORMAT_DTYPES.get(p.format)) for p in outs)
    return inputs, outputs


def vgf_io(processed: bytes) -> tuple[tuple[VgfTensor, ...], tuple[VgfTensor, ...]]:
    """The inputs and outputs a VGF declares (``vgf_dump``'s scenario template), in order."""
    inputs, outputs = _vgf_io_cached(bytes(processed))
    return inputs, outputs


def _numpy_dtype(dtype: torch.dtype | None) -> np.dtype[Any] | None:
    if dtype is None:
        return None
    try:
        result: np.dtype[Any] = torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:  # bfloat16, float8: no numpy dtype
        return None
    return result


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class VgfDelegate:
    """A VGF run by ``scenario_runner`` (Vulkan, ML emulation layers)."""

    def execute(self, call: DelegateCall) -> str:
        from etkit_exporter.scenario import ScenarioError, run_vgf

        processed = call.delegate.processed
        try:
            declared_inputs, declared_outputs = vgf_io(processed)
        except ScenarioError as error:
            raise call.fail(f"cannot read the VGF's declarations: {error}") from None
        if len(call.inputs) != len(declared_inputs) or len(call.outputs) != len(declared_outputs):
            raise call.fail(
                f"the VGF declares {len(declared_inputs)} inputs and {len(declared_outputs)} "
                f"outputs, the program passes {len(call.inputs)} and {len(call.outputs)}"
            )
        arrays = []
        for k, (tensor, info, declared) in enumerate(
            zip(call.inputs, call.input_infos, declared_inputs, strict=True)
        ):
            memory = self._check(call, f"input {k}", tensor, info, declared)
            raw = memory.contiguous().reshape(-1).view(torch.uint8).numpy()
            assert declared.dtype is not None
            arrays.append(raw.view(declared.dtype).reshape(declared.dims))
        try:
            results = run_vgf(processed, arrays)
        except ScenarioError as error:
            raise call.fail(str(error)) from None
        for k, (tensor, info, declared, result) in enumerate(
            zip(call.outputs, call.output_infos, declared_outputs, results, strict=True)
        ):
            memory = self._check(call, f"output {k}", tensor, info, declared)
            raw = np.ascontiguousarray(result).reshape(-1).view(np.uint8)
            if raw.size != memory.numel() * memory.element_size():
                raise call.fail(
                    f"the VGF wrote {raw.size} bytes as output {k}, the program's value "
                    f"{info.index} holds {memory.numel() * memory.element_size()}"
                )
            memory.copy_(torch.from_numpy(raw.copy()).view(tensor.dtype).reshape(memory.shape))
        return "scenario_runner (Vulkan, ML emulation layers)"

    @staticmethod
    def _check(
        call: DelegateCall, what: str, tensor: torch.Tensor, info: TensorInfo, declared: VgfTensor
    ) -> torch.Tensor:
        """Refuses byte counts that differ (the runtime's memcpy would run past one of the two
        buffers); records a warning for a dtype or layout the VGF declares otherwise. Returns
        the tensor as its memory holds it (a view, its dimensions in dim order)."""
        if declared.dtype is None:
            raise call.fail(f"{what}: the VGF declares format {declared.format}, unknown here")
        memory = tensor.permute(info.dim_order)
        nbytes = memory.numel() * memory.element_size()
        if declared.nbytes != nbytes:
            raise call.fail(
                f"{what}: the VGF declares {declared.describe()} ({declared.nbytes} bytes), the "
                f"program's value {info.index} is {info.describe()} ({nbytes} bytes)"
            )
        problems = []
        if _numpy_dtype(tensor.dtype) != declared.dtype:
            problems.append(f"its dtype is {dtype_name(tensor.dtype)}")
        if _squeezed(memory.shape) != _squeezed(declared.dims):
            problems.append(f"its memory holds {list(memory.shape)} in that order")
        if problems:
            call.warnings.append(
                f"{call.name} {what}: the VGF declares {declared.describe()}, but the program's "
                f"value {info.index} is {info.describe()}: {' and '.join(problems)}; its bytes "
                "are copied as ExecuTorch's VGF runtime copies them (memcpy), so the VGF reads "
                "them in its own layout"
            )
        return memory


class PythonDelegate:
    """A registered Python function."""

    def __init__(self, fn: DelegateFn) -> None:
        if not callable(fn):
            raise TypeError(f"a delegate implementation must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.label = getattr(fn, "__qualname__", None) or type(fn).__name__

    def execute(self, call: DelegateCall) -> str:
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        specs = [CompileSpec(key, value) for key, value in call.delegate.compile_specs]
        result = self.fn(call.delegate.processed, specs, [t.clone() for t in call.inputs])
        outputs = [result] if isinstance(result, torch.Tensor) else list(result)
        if len(outputs) != len(call.outputs):
            raise call.fail(
                f"the Python function {self.label} returned {len(outputs)} outputs, the "
                f"program has {len(call.outputs)}"
            )
        for k, (value, target, info) in enumerate(
            zip(outputs, call.outputs, call.output_infos, strict=True)
        ):
            if not isinstance(value, torch.Tensor):
                raise call.fail(
                    f"the Python function {self.label} returned a {type(value).__name__} as "
                    f"output {k}; return torch.Tensor outputs"
                )
            if value.shape != target.shape or value.dtype != target.dtype:
                raise call.fail(
                    f"the Python function {self.label} returned {_describe(value)} as output "
                    f"{k}, the program's value {info.index} is {info.describe()}"
                )
            target.copy_(value)
        return f"Python function {self.label}"


def grid_sampler_inputs(delegate: DelegateInfo) -> int:
    """How many inputs a grid-sampler delegate takes (its blob's argument roles)."""
    from etkit_gridsampler.delegate_format import decode

    return decode(delegate.processed).roles.inputs


def vgf_inputs(delegate: DelegateInfo) -> int:
    """How many inputs a VGF delegate takes (its declarations)."""
    return len(vgf_io(delegate.processed)[0])


# How many of a delegate call's arguments are inputs, read from the blob of backends the runner
# knows, whatever implementation is registered for them.
INPUT_COUNTS: Final[dict[str, Callable[[DelegateInfo], int]]] = {
    GRID_SAMPLER_BACKEND: grid_sampler_inputs,
    VGF_BACKEND: vgf_inputs,
}


@dataclass
class Registered:
    """A registry entry: the implementation, and the output count given at registration."""

    backend: Backend
    num_outputs: int | None
    label: str


class DelegateRegistry:
    """Implementations by backend id; starts with the built-ins."""

    def __init__(self, grid_sampler_impl: GridSamplerImpl = "cpu") -> None:
        self.grid_sampler = GridSamplerDelegate(grid_sampler_impl)
        self._entries: dict[str, Registered] = {
            GRID_SAMPLER_BACKEND: Registered(self.grid_sampler, 1, "built-in (etkit_gridsampler)"),
            VGF_BACKEND: Registered(VgfDelegate(), None, "built-in (scenario_runner)"),
        }

    def register(self, backend_id: str, fn: DelegateFn, *, num_outputs: int | None = None) -> None:
        if not isinstance(backend_id, str) or not backend_id:
            raise ValueError(f"backend_id must be a non-empty string, got {backend_id!r}")
        if num_outputs is not None and (
            isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1
        ):
            raise ValueError(f"num_outputs must be a positive int or None, got {num_outputs!r}")
        delegate = PythonDelegate(fn)
        self._entries[backend_id] = Registered(
            delegate, num_outputs, f"Python function {delegate.label}"
        )

    def get(self, backend_id: str) -> Registered | None:
        return self._entries.get(backend_id)

    @property
    def backend_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))
