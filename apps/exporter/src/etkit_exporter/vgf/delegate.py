"""The VGF delegate of a .pte run in etkit_pterunner: the processed bytes are a VGF file, run
by ``scenario_runner`` on the Vulkan device with the ML emulation layers (``run_vgf``). As
ExecuTorch's VGF runtime does, each input's memory (the tensor in its dim order) is copied byte
for byte into the VGF's input of the declared dims, and each VGF output's bytes into the output
tensor's memory; where the program's layout or dtype and the VGF's declaration disagree, the
call copies the bytes all the same (what a device would compute) and records a warning."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etkit_exporter.vgf.scenario import ScenarioError, run_vgf, scenario_template, vgf_ports
from etkit_exporter.vgf.scenario_format import FORMAT_DTYPES, numpy_dtype
from etkit_pterunner import DelegateCall, DelegateInfo, TensorInfo, dtype_name


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


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class VgfDelegate:
    """A VGF run by ``scenario_runner`` (Vulkan, ML emulation layers)."""

    label = "built-in (scenario_runner)"

    def num_inputs(self, delegate: DelegateInfo) -> int:
        """The VGF's declarations say how many inputs."""
        return len(vgf_io(delegate.processed)[0])

    def execute(self, call: DelegateCall) -> str:
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
        if numpy_dtype(tensor.dtype) != declared.dtype:
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
