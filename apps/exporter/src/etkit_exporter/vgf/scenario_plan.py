"""Planning a program's scenario (``ScenarioBuilder``): the program's instructions in order,
each VGF delegate call one ``dispatch_vgf`` and each grid-sampler call one ``dispatch_compute``
(its specialized shader and parameter block), reshapes and layout-free copies aliases, and the
plan put together; or every reason the scenario runner cannot express the program. The values'
memory is ``scenario_memory``'s, the commands and their barriers ``scenario_commands``'."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND, VGF_BACKEND
from etkit_exporter.vgf.scenario import ScenarioError, scenario_template, vgf_ports
from etkit_exporter.vgf.scenario_commands import ScenarioCommands
from etkit_exporter.vgf.scenario_format import (
    DTYPE_FORMATS,
    FORMAT_DTYPES,
    GRAPH_COMMAND,
    GRAPH_COMMANDS,
    LAYOUT_OPS,
    RESHAPE_OPS,
    SHADER_FILE,
    Resource,
    ScenarioPlan,
    ScenarioUnsupportedError,
    is_channels_last,
    memory_dims,
    nonunit_order,
    npy_bytes,
    row_major,
    words,
)
from etkit_gridsampler import vulkan
from etkit_gridsampler.delegate_format import DelegateFormatError, decode
from etkit_gridsampler.plan import UnsupportedOpError
from etkit_pterunner import DelegateInfo, MethodInfo, TensorInfo, dtype_name


class ScenarioBuilder(ScenarioCommands):
    def __init__(self, method: MethodInfo, io_params: Mapping[str, Any] | None) -> None:
        super().__init__(method, io_params)
        self.shaders: dict[tuple[tuple[int, int], ...], str] = {}  # specialization -> uid
        self.params_bytes = 0

    # -- instructions ----------------------------------------------------------------------

    def build(self) -> None:
        method = self.method
        if len(method.chains) != 1:
            self.reasons.append(
                f"method '{method.name}' has {len(method.chains)} chains; a scenario is one "
                "sequence of commands"
            )
            return
        for position, index in enumerate(method.inputs):
            self.tensor(index, f"input {position}")
        for position, index in enumerate(method.outputs):
            self.tensor(index, f"output {position}")
        if self.reasons:
            return
        self.inputs, self.outputs = self.io()
        for item in method.chains[0]:
            where = f"instruction {item.position}"
            if item.kind == "free":
                continue
            if item.kind == "kernel":
                self.kernel(where, method.operators[item.operator], item.args)
            elif item.kind == "delegate":
                delegate = method.delegates[item.delegate]
                self.delegate(where, item.position, delegate, item.args)
            else:
                what = {"move": "a move between values", "jump_false": "a conditional jump"}
                self.reasons.append(
                    f"{where}: {what.get(item.kind, item.kind)} (control flow); a scenario's "
                    "commands run in one fixed order"
                )

    def kernel(self, where: str, name: str, args: tuple[int, ...]) -> None:
        if name not in RESHAPE_OPS and name not in LAYOUT_OPS:
            self.reasons.append(
                f"{where}: kernel operator {name} outside any delegate; the scenario runs VGF "
                "graphs and the grid-sampler shader only (lower it into a VGF delegate, or run "
                "the .pte)"
            )
            return
        tensors = [a for a in args if isinstance(self.method.values[a], TensorInfo)]
        if len(tensors) < 2:
            self.reasons.append(f"{where}: operator {name} without an input and an output tensor")
            return
        source, target = tensors[0], tensors[-1]
        a, b = self.tensor(source, where), self.tensor(target, where)
        if a is None or b is None:
            return
        problem = None
        if a.dtype != b.dtype:
            problem = f"converts {dtype_name(a.dtype or torch.int8)} to {b.describe()}"
        elif a.numel != b.numel:
            problem = f"maps {a.numel} elements to {b.numel}"
        elif name in RESHAPE_OPS and not (row_major(a) and row_major(b)):
            problem = (
                f"reshapes value {source} ({a.describe()}) to value {target} ({b.describe()}) "
                "across a dim order that is not row-major, which moves bytes"
            )
        elif name in LAYOUT_OPS and (a.sizes != b.sizes or nonunit_order(a) != nonunit_order(b)):
            problem = (
                f"copies value {source} ({a.describe()}) to value {target} ({b.describe()}), "
                "which moves bytes (a layout change)"
            )
        if problem is not None:
            self.reasons.append(
                f"{where}: operator {name} {problem}; the scenario would need a copy shader "
                "between delegates, which etkit does not emit"
            )
            return
        self.alias(
            source,
            target,
            f"{where}: {name} value {source} -> value {target}: the same bytes (an alias)",
        )

    def delegate(
        self, where: str, position: int, delegate: DelegateInfo, args: tuple[int, ...]
    ) -> None:
        name = f"{where}: delegate {delegate.index} ({delegate.backend_id})"
        if delegate.backend_id == VGF_BACKEND:
            self.vgf(name, position, delegate, args)
        elif delegate.backend_id == GRID_SAMPLER_BACKEND:
            self.grid_sampler(name, position, delegate, args)
        else:
            self.reasons.append(
                f"{name}: backend {delegate.backend_id}; a scenario runs VgfBackend and "
                "GridSamplerBackend delegates only"
            )

    def vgf(self, name: str, position: int, delegate: DelegateInfo, args: tuple[int, ...]) -> None:
        with tempfile.TemporaryDirectory(prefix="etkit-scenario-vgf-") as tmp:
            path = Path(tmp) / "model.vgf"
            path.write_bytes(delegate.processed)
            try:
                template = scenario_template(path)
                in_ports, out_ports = vgf_ports(path, template)
            except ScenarioError as error:
                self.reasons.append(f"{name}: cannot read the VGF's declarations: {error}")
                return
        graphs = [r["graph"] for r in template.get("resources", []) if "graph" in r]
        tensors = [r["tensor"] for r in template.get("resources", []) if "tensor" in r]
        # a compute segment at the VGF's edge binds a program value as a storage buffer
        port_uids = {p.body["uid"] for p in in_ports + out_ports}
        others = [
            next(iter(r))
            for r in template.get("resources", [])
            if not {"graph", "tensor"} & set(r)
            and not ("buffer" in r and r["buffer"].get("uid") in port_uids)
        ]
        commands = template.get("commands", [])
        template_command = next(iter(commands[0])) if len(commands) == 1 else None
        if len(graphs) != 1 or others or template_command not in GRAPH_COMMANDS:
            self.reasons.append(
                f"{name}: its VGF's scenario template holds {len(graphs)} graphs, "
                f"{len(commands)} commands and other resources {others}; etkit chains VGFs of "
                "one graph and one graph dispatch"
            )
            return
        dispatch = commands[0][template_command]
        if dispatch.get("shader_substitutions") or dispatch.get("push_constants"):
            self.reasons.append(
                f"{name}: its VGF asks for shader substitutions or push constants, which etkit "
                "does not provide"
            )
            return
        inputs, outputs = in_ports, out_ports
        if len(inputs) + len(outputs) != len(args) or not outputs:
            self.reasons.append(
                f"{name}: the VGF declares {len(inputs)} inputs and {len(outputs)} outputs, the "
                f"program passes {len(args)} arguments"
            )
            return
        refs: dict[str, str] = {}
        reads: list[Resource] = []
        writes: list[Resource] = []
        for k, (port, value) in enumerate(zip(inputs + outputs, args, strict=True)):
            role = f"input {k}" if k < len(inputs) else f"output {k - len(inputs)}"
            info = self.tensor(value, f"{name} {role}")
            if info is None:
                return
            spec = {**port.body, "dims": list(port.dims), "format": port.format}
            dims = port.dims
            dtype = FORMAT_DTYPES.get(spec["format"])
            declared = math.prod(dims) * (dtype.itemsize if dtype is not None else 0)
            if dtype is None or declared != info.nbytes:
                self.reasons.append(
                    f"{name} {role}: the VGF declares {spec['format']} {list(dims)} "
                    f"({declared} bytes), the program's value {value} is {info.describe()} "
                    f"({info.nbytes} bytes)"
                )
                return
            assert info.dtype is not None  # self.tensor checked it
            if dims != memory_dims(info) or spec["format"] != DTYPE_FORMATS[info.dtype]:
                self.notes.append(
                    f"{name} {role}: the VGF declares {spec['format']} {list(dims)}, the "
                    f"program's value {value} is {info.describe()}: the VGF reads the same bytes "
                    "in its own layout, as ExecuTorch's VGF runtime copies them"
                )
            if port.kind == "buffer":  # bound straight to a compute segment's storage buffer
                resource = self.view(value, "buffer", size=declared, name=f"value_{value}_buffer")
            else:
                resource = self.view(
                    value, "tensor", dims=dims, fmt=spec["format"], name=f"value_{value}_tensor"
                )
            refs[spec["uid"]] = resource.uid
            (reads if k < len(inputs) else writes).append(resource)
        for spec in tensors:
            if "src" in spec or "dst" in spec:
                continue
            uid = self.unique(f"vgf_{delegate.index}_{spec['uid']}")
            refs[spec["uid"]] = uid
            self.extra_resources.append({"tensor": {**spec, "uid": uid}})
        file = f"vgf_{delegate.index}.vgf"
        graph_uid = self.unique(f"vgf_{delegate.index}")
        self.files[file] = delegate.processed
        self.extra_resources.append({"graph": {"uid": graph_uid, "src": file}})
        bindings = []
        for binding in dispatch.get("bindings", []):
            ref = binding["resource_ref"]
            if ref not in refs:
                self.reasons.append(f"{name}: its VGF binds an unknown resource {ref!r}")
                return
            bindings.append({**binding, "resource_ref": refs[ref]})
        self.dispatch(
            "graph",
            {
                GRAPH_COMMAND: {
                    "graph_ref": graph_uid,
                    "bindings": bindings,
                    "implicit_barrier": False,
                }
            },
            reads,
            writes,
            {
                "instruction": position,
                "delegate": delegate.index,
                "backend": delegate.backend_id,
                "command": GRAPH_COMMAND,
                "file": file,
                "bytes": len(delegate.processed),
            },
        )

    def grid_sampler(
        self, name: str, position: int, delegate: DelegateInfo, args: tuple[int, ...]
    ) -> None:
        try:
            blob = decode(delegate.processed)
        except DelegateFormatError as error:
            self.reasons.append(f"{name}: {error}")
            return
        roles = blob.roles
        if len(args) != roles.inputs + 1:
            self.reasons.append(
                f"{name}: the blob says {roles.inputs} inputs and 1 output, the program passes "
                f"{len(args)} arguments"
            )
            return
        values = {
            "image": args[roles.image],
            "grid": args[roles.grid],
            "output": args[roles.inputs],
        }
        infos = {role: self.tensor(value, f"{name} {role}") for role, value in values.items()}
        image, grid, output = infos["image"], infos["grid"], infos["output"]
        if image is None or grid is None or output is None:
            return
        if blob.op.is_float:
            self.reasons.append(
                f"{name}: a float32 grid sampler; the Vulkan grid-sampler kernel implements the "
                "integer contract only (export with quantization)"
            )
            return
        channels_last = is_channels_last(image)
        problems = []
        if tuple(image.sizes) != tuple(blob.image_shape):
            problems.append(f"the image is {image.describe()}, the blob says {blob.image_shape}")
        if tuple(grid.sizes) != tuple(blob.grid_shape):
            problems.append(f"the grid is {grid.describe()}, the blob says {blob.grid_shape}")
        if not channels_last and not row_major(image):
            problems.append(f"the image's dim order {image.dim_order} is neither NCHW nor NHWC")
        if not row_major(grid):
            problems.append(f"the grid's dim order {grid.dim_order} is not contiguous")
        if is_channels_last(output) != channels_last or not (
            is_channels_last(output) or row_major(output)
        ):
            problems.append(
                f"the output's dim order {output.dim_order} differs from the image's "
                f"{image.dim_order} (the kernel writes the image's layout)"
            )
        if problems:
            self.reasons.append(f"{name}: " + "; ".join(problems))
            return
        try:
            kernel = vulkan.dispatch(
                tuple(image.sizes), tuple(grid.sizes), blob.op, channels_last=channels_last
            )
        except (UnsupportedOpError, ValueError, TypeError) as error:
            self.reasons.append(f"{name}: the Vulkan grid-sampler kernel refuses it: {error}")
            return
        shader_uid = self.shader(kernel.specialization_constants)
        params = kernel.params_bytes()
        params = params + bytes(words(len(params)) - len(params))
        params_file = f"sampler_{delegate.index}_params.npy"
        self.files[params_file] = npy_bytes(np.frombuffer(params, dtype=np.uint8))
        params_uid = self.unique(f"sampler_{delegate.index}_params")
        self.extra_resources.append(
            {
                "buffer": {
                    "uid": params_uid,
                    "size": len(params),
                    "shader_access": "readonly",
                    "src": params_file,
                }
            }
        )
        self.params_bytes += len(params)
        bindings: list[dict[str, Any]] = []
        reads: list[Resource] = []
        writes: list[Resource] = []
        sizes: dict[str, int] = {}
        for set_index, binding, role, _, size in kernel.bindings:
            if role == "params":
                ref = params_uid
            elif role in values:
                info = infos[role]
                assert info is not None
                if size > words(info.nbytes):
                    self.reasons.append(
                        f"{name}: the kernel's {role} buffer is {size} bytes, the program's "
                        f"value {values[role]} holds {info.nbytes}"
                    )
                    return
                resource = self.view(
                    values[role],
                    "buffer",
                    size=words(info.nbytes),
                    name=f"value_{values[role]}_buffer",
                )
                (writes if role == "output" else reads).append(resource)
                ref = resource.uid
                sizes[role] = resource.size
            else:
                self.reasons.append(
                    f"{name}: the kernel binds a {role!r} buffer etkit does not know "
                    "(etkit_gridsampler.vulkan.KernelDispatch changed)"
                )
                return
            bindings.append({"set": set_index, "id": binding, "resource_ref": ref})
        groups = [int(g) for g in kernel.group_counts]
        self.dispatch(
            "compute",
            {
                "dispatch_compute": {
                    "shader_ref": shader_uid,
                    "bindings": bindings,
                    "rangeND": groups,
                    "implicit_barrier": False,
                }
            },
            reads,
            writes,
            {
                "instruction": position,
                "delegate": delegate.index,
                "backend": delegate.backend_id,
                "command": "dispatch_compute",
                "file": SHADER_FILE,
                "shader": shader_uid,
                "specialization_constants": {
                    name: value for _, name, value in kernel.specialization_constants
                },
                "params": params_file,
                "rangeND": groups,
                "workgroup_size": list(kernel.workgroup_size),
                "op": {
                    "mode": blob.op.mode,
                    "padding_mode": blob.op.padding_mode,
                    "align_corners": bool(blob.op.align_corners),
                },
                "buffer_bytes": sizes,
            },
        )

    def shader(self, constants: tuple[tuple[int, str, int], ...]) -> str:
        """The uid of the grid-sampler shader resource specialized with ``constants`` ((id,
        name, value), ``KernelDispatch.specialization_constants``): one resource per distinct
        configuration, all of them the one SPIR-V file. Specialized, a pipeline compiles only
        its configuration's branches (on lavapipe about 4x faster than the unspecialized
        shader, which reads every switch from the parameter block)."""

        key = tuple((constant_id, value) for constant_id, _, value in constants)
        uid = self.shaders.get(key)
        if uid is not None:
            return uid
        if not self.shaders:
            self.files[SHADER_FILE] = vulkan.spirv()
        uid = self.unique("grid_sample")
        self.shaders[key] = uid
        shader: dict[str, Any] = {"uid": uid, "src": SHADER_FILE, "type": "SPIR-V"}
        if key:
            shader["specialization_constants"] = [{"id": i, "value": v} for i, v in key]
        self.extra_resources.append({"shader": shader})
        return uid

    def plan(self) -> ScenarioPlan:
        self.build()
        if self.reasons:
            raise ScenarioUnsupportedError(self.reasons)
        self.constants()
        self.textures()
        for storage in self.storages.values():
            if storage.last_write is None and not any(r.src for r in storage.resources):
                self.reasons.append(
                    f"value {storage.root} is read or returned, but no command writes it and no "
                    "file fills it"
                )
        if self.reasons:
            raise ScenarioUnsupportedError(self.reasons)
        inputs, outputs = self.inputs, self.outputs
        self.final_barrier()
        resources, memory = self.group_resources()
        memory += self.params_bytes
        barrier_resources = self.barrier_resources()
        scenario = {
            "resources": self.extra_resources + resources + barrier_resources,
            "commands": self.commands,
        }
        by_uid = {b["memory_barrier"]["uid"]: b["memory_barrier"] for b in barrier_resources}
        barriers = [
            {**use, "memory_barriers": [by_uid[uid] for uid in use["barriers"]]}
            for use in self.barrier_uses
        ]
        return ScenarioPlan(
            scenario,
            self.files,
            inputs,
            outputs,
            self.dispatches,
            barriers,
            self.aliases,
            list(dict.fromkeys(self.notes)),
            memory,
        )
