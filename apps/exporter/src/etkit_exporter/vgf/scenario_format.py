"""The scenario folder's format (docs/scenario.md): its file names, the tensor and image
formats, the memory a program value gets (``ScenarioIO``: an input's or output's file in memory
order), what a plan holds, and the kernel operators that only reinterpret memory."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import torch

from etkit_pterunner import TensorInfo

SCENARIO_DIR: Final = "scenario"
SCENARIO_JSON: Final = "scenario.json"
SIDECAR_JSON: Final = "etkit_scenario.json"
SHADER_FILE: Final = "grid_sample.spv"
SIDECAR_FORMAT: Final = "etkit-scenario/1"
RUN_SCRIPT: Final = "run.sh"
# What a user runs: scenario_runner needs VK_ARM_tensors / VK_ARM_data_graph, which only the ML
# emulation layers give most drivers (lavapipe included), loaded as etkit loads them.
RUN_SCRIPT_TEXT: Final = """\
#!/bin/sh
# Runs this folder's scenario (the whole etkit export, one Vulkan scenario) with Arm's
# scenario_runner and writes its outputs (output_K.npy, memory order) into the folder OUT:
#
#   sh run.sh OUT
#
# scenario_runner asks the Vulkan driver for VK_ARM_tensors and VK_ARM_data_graph. Most drivers
# (lavapipe, desktop GPUs) get them from Arm's ML emulation layers, which this script loads as
# etkit does (`etkit vulkan-env`, from etkit's virtualenv: source .venv/bin/activate first).
# On a device whose driver implements both extensions itself, run without the layers:
#
#   ETKIT_NATIVE_VULKAN=1 sh run.sh OUT
#   (or: scenario_runner --scenario scenario.json --output OUT)
set -eu
if [ $# -ne 1 ]; then
    echo "usage: sh $0 OUT  (OUT: the folder the outputs are written into)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
if [ -z "${ETKIT_NATIVE_VULKAN:-}" ]; then
    if ! command -v etkit >/dev/null 2>&1; then
        echo "$0: etkit is not on PATH: activate etkit's virtualenv (source .venv/bin/activate)," \\
            "or set ETKIT_NATIVE_VULKAN=1 on a driver with VK_ARM_tensors" >&2
        exit 2
    fi
    eval "$(etkit vulkan-env)"
fi
exec scenario_runner --scenario "$here/scenario.json" --output "$1"
"""

# The commands, by their scenario_runner 0.11 names (0.11 still reads the older
# "dispatch_graph" and "dispatch_barrier", with a deprecation warning; vgf_dump's templates use
# "dispatch_graph").
GRAPH_COMMAND: Final = "dispatch_vgf"
BARRIER_COMMAND: Final = "pipeline_barrier"
GRAPH_COMMANDS: Final = ("dispatch_vgf", "dispatch_graph")


# Tensor formats by dtype (the VGF's own declarations use the same names), and the numpy dtype of
# each format (FORMAT_DTYPES: the same map the other way round).
DTYPE_FORMATS: Final[dict[torch.dtype, str]] = {
    torch.int8: "VK_FORMAT_R8_SINT",
    torch.uint8: "VK_FORMAT_R8_UINT",
    torch.bool: "VK_FORMAT_R8_BOOL_ARM",
    torch.int16: "VK_FORMAT_R16_SINT",
    torch.uint16: "VK_FORMAT_R16_UINT",
    torch.int32: "VK_FORMAT_R32_SINT",
    torch.uint32: "VK_FORMAT_R32_UINT",
    torch.int64: "VK_FORMAT_R64_SINT",
    torch.float16: "VK_FORMAT_R16_SFLOAT",
    torch.float32: "VK_FORMAT_R32_SFLOAT",
}


def numpy_dtype(dtype: torch.dtype | None) -> np.dtype[Any] | None:
    """The numpy dtype of a torch dtype; None for None and for dtypes numpy lacks (bfloat16,
    float8)."""
    if dtype is None:
        return None
    try:
        result: np.dtype[Any] = torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:
        return None
    return result


FORMAT_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    fmt: np.dtype(numpy_dtype(dtype)) for dtype, fmt in DTYPE_FORMATS.items()
}

# Image formats an engine can alias a texture-like IO tensor with (io_quant_params.json
# "texture" format, channels) -> VkFormat.
TEXTURE_FORMATS: Final[dict[tuple[str, int], str]] = {
    ("R8_SNORM", 1): "VK_FORMAT_R8_SNORM",
    ("R8_SNORM", 2): "VK_FORMAT_R8G8_SNORM",
    ("R8_SNORM", 4): "VK_FORMAT_R8G8B8A8_SNORM",
    ("R8_UNORM", 1): "VK_FORMAT_R8_UNORM",
    ("R8_UNORM", 2): "VK_FORMAT_R8G8_UNORM",
    ("R8_UNORM", 4): "VK_FORMAT_R8G8B8A8_UNORM",
}

# Kernel operators that only reinterpret their input's memory when both sides lay their
# elements out in row-major order (a reshape keeps the row-major element order).
RESHAPE_OPS: Final = frozenset(
    {
        "executorch_prim::et_view.default",
        "aten::view_copy.out",
        "aten::_unsafe_view.out",
        "aten::reshape.out",
        "aten::squeeze_copy.out",
        "aten::squeeze_copy.dim_out",
        "aten::squeeze_copy.dims_out",
        "aten::unsqueeze_copy.out",
        "aten::alias_copy.out",
    }
)
# Kernel operators that keep every element where it is logically (their output has the input's
# sizes), only changing the dim order: no-ops when the bytes stay in the same order.
LAYOUT_OPS: Final = frozenset(
    {
        "dim_order_ops::_to_dim_order_copy.out",
        "dim_order_ops::_clone_dim_order.out",
        "aten::clone.out",
        "aten::_to_copy.out",
    }
)

Stage = Literal["graph", "compute"]
ACCESS: Final[dict[tuple[str, str], str]] = {
    ("graph", "read"): "graph_read",
    ("graph", "write"): "graph_write",
    ("compute", "read"): "compute_shader_read",
    ("compute", "write"): "compute_shader_write",
}


class ScenarioUnsupportedError(ValueError):
    """The program holds something the scenario runner cannot express; ``reasons`` lists each,
    naming the instruction and the construct."""

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)
        super().__init__(
            "no scenario: the scenario runner cannot express "
            + ("this program: " if len(self.reasons) == 1 else "these constructs: ")
            + "; ".join(self.reasons)
        )


def words(nbytes: int) -> int:
    """``nbytes`` padded to whole 32-bit words (the shader reads and writes words), at least 4."""
    return max(4, math.ceil(nbytes / 4) * 4)


def memory_dims(info: TensorInfo) -> tuple[int, ...]:
    """The sizes of ``info`` in memory order (``[N, H, W, C]`` for a channels-last tensor)."""
    dims = tuple(info.sizes[d] for d in info.dim_order)
    return dims or (1,)


def file_dims(memory: Sequence[int]) -> tuple[int, ...]:
    """The dims of an IO tensor resource and its ``.npy``: the memory-order sizes, the leading
    ones merged into one when there are more than 4 (a scenario tensor has at most 4)."""
    dims = tuple(memory)
    if len(dims) <= 4:
        return dims
    return (math.prod(dims[: len(dims) - 3]), *dims[len(dims) - 3 :])


def nonunit_order(info: TensorInfo) -> list[int]:
    return [d for d in info.dim_order if info.sizes[d] != 1]


def row_major(info: TensorInfo) -> bool:
    order = nonunit_order(info)
    return order == sorted(order)


@dataclass
class Resource:
    uid: str
    kind: Literal["tensor", "buffer", "image"]
    storage: int
    dims: tuple[int, ...] = ()
    format: str = ""
    size: int = 0
    src: str | None = None
    dst: str | None = None
    reads: bool = False
    writes: bool = False
    note: str = ""

    @property
    def nbytes(self) -> int:
        if self.kind in ("buffer", "image"):
            return self.size
        return math.prod(self.dims) * _FORMAT_ITEMSIZE.get(self.format, 1)

    def access(self) -> str:
        if self.kind == "image":
            return "image_read"
        if self.reads and self.writes:
            return "readwrite"
        if self.writes or (self.dst is not None and not self.reads):
            return "writeonly"
        return "readonly"

    def to_json(self, group: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"uid": self.uid}
        if self.kind == "buffer":
            body["size"] = self.size
        else:
            body["dims"] = list(self.dims)
            body["format"] = self.format
        body["shader_access"] = self.access()
        if self.src is not None:
            body["src"] = self.src
        if self.dst is not None:
            body["dst"] = self.dst
        if group is not None:
            body["memory_group"] = {"id": group}
        return {self.kind: body}


_FORMAT_ITEMSIZE: Final[dict[str, int]] = {
    fmt: torch.empty((), dtype=dtype).element_size() for dtype, fmt in DTYPE_FORMATS.items()
}


@dataclass
class Storage:
    """Memory one or more program values share (a value and its no-op views)."""

    root: int
    nbytes: int
    values: list[int] = field(default_factory=list)
    resources: list[Resource] = field(default_factory=list)
    last_write: str | None = None
    visible_to: set[str] = field(default_factory=set)
    readers: set[str] = field(default_factory=set)

    @property
    def group(self) -> str:
        return f"value_{self.root}"


@dataclass(frozen=True)
class ScenarioIO:
    """An input or output of the scenario: the program value, its file and layout."""

    index: int
    value: int
    resource: str
    file: str
    shape: tuple[int, ...]
    dim_order: tuple[int, ...]
    dtype: str
    memory_shape: tuple[int, ...]
    texture: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "value": self.value,
            "resource": self.resource,
            "file": self.file,
            "shape": list(self.shape),
            "dim_order": list(self.dim_order),
            "dtype": self.dtype,
            "memory_shape": list(self.memory_shape),
            "texture": self.texture,
        }


@dataclass
class ScenarioPlan:
    """A scenario built from a program, before it is written: the JSON, the files it names
    (but the inputs) and a description for the report."""

    scenario: dict[str, Any]
    files: dict[str, bytes]
    inputs: list[ScenarioIO]
    outputs: list[ScenarioIO]
    dispatches: list[dict[str, Any]]
    barriers: list[dict[str, Any]]
    aliases: list[str]
    notes: list[str]
    memory_bytes: int

    def summary(self) -> dict[str, Any]:
        """What the scenario holds (the sidecar ``etkit_scenario.json``, less the file sizes)."""
        kinds: dict[str, int] = {}
        groups = set()
        for resource in self.scenario["resources"]:
            ((kind, body),) = resource.items()
            kinds[kind] = kinds.get(kind, 0) + 1
            if "memory_group" in body:
                groups.add(body["memory_group"]["id"])
        commands: dict[str, int] = {}
        for command in self.scenario["commands"]:
            ((kind, _),) = command.items()
            commands[kind] = commands.get(kind, 0) + 1
        return {
            "format": SIDECAR_FORMAT,
            "scenario": SCENARIO_JSON,
            "inputs": [io.to_json() for io in self.inputs],
            "outputs": [io.to_json() for io in self.outputs],
            "dispatches": self.dispatches,
            "barriers": self.barriers,
            "commands": commands,
            "resources": dict(sorted(kinds.items())),
            "memory_groups": len(groups),
            "memory_bytes": self.memory_bytes,
            "aliases": self.aliases,
            "notes": self.notes,
            "run": f"sh {SCENARIO_DIR}/{RUN_SCRIPT} OUT",
        }


def is_channels_last(info: TensorInfo) -> bool:
    """As ``etkit_gridsampler.cpu.is_channels_last`` sees a tensor laid out as ``info`` says:
    NHWC in memory and not also contiguous (C == 1)."""
    if len(info.sizes) != 4:
        return False
    probe = torch.empty_strided(info.sizes, info.strides, dtype=torch.int8)
    return bool(probe.is_contiguous(memory_format=torch.channels_last)) and not bool(
        probe.is_contiguous()
    )


def npy_bytes(array: npt.NDArray[Any]) -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
    return stream.getvalue()


def memory_order(value: torch.Tensor | npt.NDArray[Any], io: ScenarioIO) -> npt.NDArray[Any]:
    """A program input (its logical shape, the program's dtype) as the scenario's ``.npy``
    holds it: in memory order. Raises ``ValueError`` for another shape or dtype."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if tuple(array.shape) != io.shape or str(array.dtype) != io.dtype:
        raise ValueError(
            f"input {io.index}: the program takes {io.dtype} {list(io.shape)}, got "
            f"{array.dtype} {list(array.shape)}"
        )
    return np.ascontiguousarray(np.transpose(array, io.dim_order)).reshape(
        file_dims(io.memory_shape)
    )
