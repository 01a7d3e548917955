"""A scenario's memory (``ScenarioMemory``, the base of ``ScenarioBuilder``): the program's
values checked as the scenario can pass them, the memory groups they share (a reshape or a
layout-free copy aliases its output with its input), the resources through which each group is
read or written (tensors, buffers, the images aliasing texture-like IO), the inputs and outputs
with their files, and the constants initialised from the program."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal

import numpy as np

from etkit_exporter.vgf.scenario_format import (
    DTYPE_FORMATS,
    TEXTURE_FORMATS,
    Resource,
    ScenarioIO,
    Storage,
    file_dims,
    is_channels_last,
    memory_dims,
    npy_bytes,
    numpy_dtype,
)
from etkit_pterunner import MethodInfo, TensorInfo, dtype_name

# A linear image's row pitch on lavapipe (measured: RGBA rows of 64, 128 and 192 bytes alias
# their tensor as it is; rows of 32, 96 and 160 bytes lie at a larger pitch). An image aliases
# an input tensor only where its rows need no padding (a VGF writes an output tensor through
# its strides, and reads an input as if packed).
IMAGE_ROW_ALIGNMENT: Final = 64


class ScenarioMemory:
    """The values of ``method`` and their memory; ``reasons`` collects every construct the
    scenario cannot express, ``files`` and ``extra_resources`` what the scenario adds beside the
    values' own resources."""

    def __init__(self, method: MethodInfo, io_params: Mapping[str, Any] | None) -> None:
        self.method = method
        self.io_params = io_params
        self.reasons: list[str] = []
        self.notes: list[str] = []
        self.aliases: list[str] = []
        self.parent: dict[int, int] = {}
        self.storages: dict[int, Storage] = {}
        self.extra_resources: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}
        self.uids: set[str] = set()
        self.inputs: list[ScenarioIO] = []
        self.outputs: list[ScenarioIO] = []
        self.pending_textures: list[tuple[str, int, str, int, Mapping[str, Any]]] = []

    # -- values and their memory -----------------------------------------------------------

    def find(self, value: int) -> int:
        while self.parent.get(value, value) != value:
            value = self.parent[value]
        return value

    def tensor(self, value: int, where: str) -> TensorInfo | None:
        info = self.method.values[value]
        if not isinstance(info, TensorInfo):
            self.reasons.append(
                f"{where}: value {value} is a {type(info).__name__}, not a tensor; the scenario "
                "passes tensors only"
            )
            return None
        if info.dtype is None or info.dtype not in DTYPE_FORMATS:
            self.reasons.append(
                f"{where}: value {value} ({info.describe()}) has a dtype no Vulkan tensor format "
                "holds here"
            )
            return None
        if info.dynamic:
            self.reasons.append(
                f"{where}: value {value} ({info.describe()}) has a dynamic shape; a scenario's "
                "resources have fixed sizes"
            )
            return None
        if info.storage in ("mutable", "external"):
            self.reasons.append(
                f"{where}: value {value} ({info.describe()}) is {info.storage} state, which a "
                "scenario does not carry"
            )
            return None
        return info

    def storage(self, value: int) -> Storage:
        root = self.find(value)
        if root not in self.storages:
            info = self.method.values[root]
            assert isinstance(info, TensorInfo)
            self.storages[root] = Storage(root, info.nbytes, [root])
        return self.storages[root]

    def alias(self, source: int, target: int, why: str) -> None:
        a, b = self.storage(source), self.storage(target)
        if a.root != b.root:
            self.parent[b.root] = a.root
            del self.storages[b.root]
            a.values += b.values
            for resource in b.resources:
                resource.storage = a.root
            a.resources += b.resources
            if b.last_write is not None or b.readers:
                self.reasons.append(f"{why}: the target was used before the alias was made")
        self.aliases.append(why)

    def unique(self, uid: str) -> str:
        candidate, k = uid, 1
        while candidate in self.uids:
            k += 1
            candidate = f"{uid}_{k}"
        self.uids.add(candidate)
        return candidate

    def view(
        self,
        value: int,
        kind: Literal["tensor", "buffer"],
        *,
        dims: tuple[int, ...] = (),
        fmt: str = "",
        size: int = 0,
        name: str,
    ) -> Resource:
        """The resource through which ``value`` is read or written as ``kind`` of ``dims`` and
        ``fmt`` (tensor) or ``size`` bytes (buffer): an existing one of its memory, or a new
        one."""
        storage = self.storage(value)
        for resource in storage.resources:
            if resource.kind != kind:
                continue
            if kind == "tensor" and (resource.dims, resource.format) == (dims, fmt):
                return resource
            if kind == "buffer" and resource.size == size:
                return resource
        resource = Resource(self.unique(name), kind, storage.root, dims, fmt, size)
        storage.resources.append(resource)
        return resource

    # -- inputs, outputs and constants -----------------------------------------------------

    def io(self) -> tuple[list[ScenarioIO], list[ScenarioIO]]:
        method = self.method
        result: dict[str, list[ScenarioIO]] = {"inputs": [], "outputs": []}
        for kind, indices in (("inputs", method.inputs), ("outputs", method.outputs)):
            entries = (self.io_params or {}).get(kind, [])
            for position, value in enumerate(indices):
                info = method.values[value]
                if not isinstance(info, TensorInfo) or info.dtype is None:
                    continue
                dims = memory_dims(info)
                stem = f"{kind[:-1]}_{position}"
                resource = Resource(
                    self.unique(stem),
                    "tensor",
                    self.storage(value).root,
                    file_dims(dims),
                    DTYPE_FORMATS[info.dtype],
                )
                file = f"{stem}.npy"
                if kind == "inputs":
                    resource.src = file
                else:
                    resource.dst = file
                storage = self.storage(value)
                storage.resources.insert(0, resource)
                entry = entries[position] if position < len(entries) else {}
                if isinstance(entry, Mapping) and isinstance(entry.get("texture"), Mapping):
                    self.pending_textures.append((kind, len(result[kind]), stem, value, entry))
                result[kind].append(
                    ScenarioIO(
                        position,
                        value,
                        resource.uid,
                        file,
                        tuple(info.sizes),
                        tuple(info.dim_order),
                        dtype_name(info.dtype),
                        dims,
                    )
                )
        return result["inputs"], result["outputs"]

    def textures(self) -> None:
        """Image resources aliasing the texture-like IO tensors (io_quant_params.json's
        "texture": RGBA SNORM8/UNORM8), as an engine aliases them with its own images, where
        that keeps the bytes every other view reads."""
        for kind, position, stem, value, entry in self.pending_textures:
            ios = self.inputs if kind == "inputs" else self.outputs
            io = ios[position]
            info = self.method.values[value]
            assert isinstance(info, TensorInfo)
            texture = entry["texture"]
            described: dict[str, Any] = {"texture": texture.get("format"), "image": None}
            storage = self.storage(value)
            fmt = None
            if len(info.sizes) == 4:
                _, channels, height, width = info.sizes
                fmt = TEXTURE_FORMATS.get((str(texture.get("format")), channels))
                described["image_format"] = fmt
                described["image_dims"] = [1, width, height, 1]
            if fmt is None or not (is_channels_last(info) or info.sizes[1] == 1):
                described["why_no_image"] = (
                    f"{info.describe()}: no image format aliases it (an image here is one "
                    "channels-last plane of 1, 2 or 4 channels; give the model RGBA inputs)"
                )
            elif memory_dims(info)[-1] != info.sizes[1]:
                # C = 1 in NCHW order (the same bytes as NHWC, declared N x 1 x H x W by the
                # VGF): scenario_runner aliases an image only with a tensor whose innermost
                # dim is the image's component count.
                described["why_no_image"] = (
                    f"{info.describe()}: its tensor is declared {list(memory_dims(info))}, and "
                    "an image aliases only a tensor whose innermost dim is its channel count"
                )
            elif info.sizes[0] != 1:
                described["why_no_image"] = (
                    f"batch {info.sizes[0]}: an image holds one plane; alias each batch element"
                )
            elif (
                kind == "inputs"
                and (row := info.nbytes // (info.sizes[0] * info.sizes[2])) % IMAGE_ROW_ALIGNMENT
            ):
                described["why_no_image"] = (
                    f"its rows are {row} bytes, not a multiple of {IMAGE_ROW_ALIGNMENT}: a "
                    "linear image lays them at a larger pitch, and the VGF reads an input "
                    "tensor so aliased as if packed (docs/scenario.md)"
                )
            elif any(r.kind == "buffer" for r in storage.resources):
                described["why_no_image"] = (
                    "the grid-sampler shader reads or writes this memory as packed 32-bit words; "
                    "a tensor aliased with an image takes the image's layout (its row pitch, or "
                    "an optimal tiling), which packed words do not follow (docs/scenario.md)"
                )
            else:
                image = Resource(
                    self.unique(f"{stem}_image"),
                    "image",
                    storage.root,
                    (1, info.sizes[3], info.sizes[2], 1),
                    fmt,
                    size=info.nbytes,
                )
                storage.resources.append(image)
                described["image"] = image.uid
            ios[position] = dataclasses.replace(io, texture=described)

    def constants(self) -> None:
        """Constant tensors passed to delegates become tensors initialised from the program."""
        for storage in self.storages.values():
            info = self.method.values[storage.root]
            assert isinstance(info, TensorInfo)
            if info.storage != "constant" or any(r.src for r in storage.resources):
                continue
            assert info.constant_index is not None and info.dtype is not None
            data = self.method.constants[info.constant_index][: info.nbytes]
            dims = file_dims(memory_dims(info))
            array = np.frombuffer(data, dtype=numpy_dtype(info.dtype)).reshape(dims)
            file = f"constant_{storage.root}.npy"
            self.files[file] = npy_bytes(array)
            resource = Resource(
                self.unique(f"constant_{storage.root}"),
                "tensor",
                storage.root,
                dims,
                DTYPE_FORMATS[info.dtype],
                src=file,
            )
            storage.resources.insert(0, resource)

    def group_resources(self) -> tuple[list[dict[str, Any]], int]:
        """The resources of every memory group that a command or a file uses (and the images
        aliasing the IO), tagged with their group where a group has several, and the bytes the
        groups take (each its largest resource)."""
        resources: list[dict[str, Any]] = []
        memory = 0
        for storage in sorted(self.storages.values(), key=lambda s: s.root):
            live = [r for r in storage.resources if r.reads or r.writes or r.src or r.dst]
            live += [r for r in storage.resources if r.kind == "image" and r not in live]
            if not live:
                continue
            group = storage.group if len(live) > 1 else None
            memory += max(r.nbytes for r in live)
            resources += [r.to_json(group) for r in live]
        return resources, memory
