"""Running VGF programs on Vulkan through Arm's ``scenario_runner``."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.export import ExportedProgram

from etkit_exporter.core.backend_ids import VGF_BACKEND
from etkit_exporter.vgf.scenario_format import (
    FORMAT_DTYPES,
    SCENARIO_JSON,
    SIDECAR_JSON,
    ScenarioIO,
    memory_order,
)
from etkit_exporter.vgf.tools import find_tool
from etkit_exporter.vgf.vulkan_env import ml_emulation_env


class ScenarioError(RuntimeError):
    """scenario_runner failed, or its inputs do not fit the VGF."""


def vgf_delegates(program: ExportedProgram) -> list[bytes]:
    """The VGF binaries of a lowered program's VGF delegates, in graph order."""
    blobs = []
    for node in program.graph_module.graph.nodes:
        if node.op != "get_attr":
            continue
        module = getattr(program.graph_module, str(node.target), None)
        if getattr(module, "backend_id", None) == VGF_BACKEND:
            blobs.append(bytes(module.processed_bytes))  # type: ignore[union-attr]
    return blobs


def scenario_template(vgf_path: Path) -> dict[str, Any]:
    """The scenario that ``vgf_dump --scenario-template`` writes for a VGF file."""
    return embedded_shaders(_vgf_dump(vgf_path, "--scenario-template"))


def embedded_shaders(scenario: dict[str, Any]) -> dict[str, Any]:
    """``scenario`` running each COMPUTE segment with the SPIR-V embedded in the VGF:
    ``vgf_dump --scenario-template`` gives every compute segment a ``shader_substitutions``
    entry pointing at a placeholder file (scenario_runner then stops: "Cannot open SPIR-V
    shader file"); this drops those entries and the placeholder shader resources."""
    placeholders = {
        body["uid"]
        for resource in scenario.get("resources", [])
        for kind, body in resource.items()
        if kind == "shader" and str(body.get("src", "")).startswith("TEMPLATE_PATH_")
    }
    for command in scenario.get("commands", []):
        dispatch = command.get("dispatch_graph")
        if isinstance(dispatch, dict) and "shader_substitutions" in dispatch:
            kept = [
                s
                for s in dispatch["shader_substitutions"]
                if s.get("shader_ref") not in placeholders
            ]
            if kept:
                dispatch["shader_substitutions"] = kept
            else:
                del dispatch["shader_substitutions"]
    scenario["resources"] = [
        r
        for r in scenario.get("resources", [])
        if r.get("shader", {}).get("uid") not in placeholders
    ]
    return scenario


@dataclass(frozen=True)
class VgfPort:
    """One input or output of a VGF as its scenario template binds it: ``body`` is the
    template's resource (a ``tensor``, or a ``buffer`` where the VGF binds the value straight to
    a compute segment's storage buffer), ``dims`` and ``format`` what the VGF declares."""

    index: int
    kind: str
    body: dict[str, Any]
    dims: tuple[int, ...]
    format: str


def vgf_declarations(vgf_path: Path) -> dict[str, Any]:
    """``vgf_dump``'s description of a VGF file (segments, resources, model sequence)."""
    return _vgf_dump(vgf_path)


def _vgf_dump(vgf_path: Path, *flags: str) -> dict[str, Any]:
    """The JSON ``vgf_dump`` writes for a VGF file with ``flags``."""
    with tempfile.TemporaryDirectory(prefix="etkit-vgf-dump-") as tmp:
        out = Path(tmp) / "vgf.json"
        done = subprocess.run(
            [find_tool("vgf_dump"), "-i", str(vgf_path), "-o", str(out), *flags],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ScenarioError(f"vgf_dump failed on {vgf_path}:\n{done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def vgf_ports(vgf_path: Path, scenario: dict[str, Any]) -> tuple[list[VgfPort], list[VgfPort]]:
    """The inputs and outputs of the VGF at ``vgf_path`` in the order the VGF numbers them, with
    the resources of its scenario template ``scenario`` that bind them: tensors, and the storage
    buffers through which a compute segment at the VGF's edge reads or writes a value directly.
    Matched through the graph dispatch's bindings (the template numbers its tensor and buffer
    placeholders separately, so their names do not give the VGF's order); dims and format come
    from the VGF's resource table."""
    declarations = vgf_declarations(vgf_path)
    bodies = {
        body["uid"]: (kind, body)
        for resource in scenario.get("resources", [])
        for kind, body in resource.items()
        if kind in ("tensor", "buffer")
    }
    dispatches = [
        body
        for command in scenario.get("commands", [])
        for kind, body in command.items()
        if kind in ("dispatch_graph", "dispatch_vgf")
    ]
    if len(dispatches) != 1:
        raise ScenarioError(
            f"{vgf_path}: its scenario template has {len(dispatches)} graph dispatches, not 1"
        )
    by_binding = {int(b["id"]): str(b["resource_ref"]) for b in dispatches[0].get("bindings", [])}
    ports: dict[str, list[VgfPort]] = {}
    for role in ("inputs", "outputs"):
        ports[role] = []
        for entry in sorted(declarations["model_sequence"][role], key=lambda e: int(e["index"])):
            uid = by_binding.get(int(entry["binding"]))
            if uid is None or uid not in bodies:
                raise ScenarioError(
                    f"{vgf_path}: no resource of its scenario template binds {role[:-1]} "
                    f"{entry['index']} (binding {entry['binding']})"
                )
            kind, body = bodies[uid]
            table = declarations["resources"][int(entry["mrt_index"])]
            dims = tuple(int(d) for d in table["shape"])
            ports[role].append(VgfPort(int(entry["index"]), kind, body, dims, table["vk_format"]))
    return ports["inputs"], ports["outputs"]


def run_vgf(
    vgf: Path | bytes,
    inputs: Sequence[npt.NDArray[Any]],
    workdir: Path | None = None,
) -> list[npt.NDArray[Any]]:
    """Runs a VGF (a file, or the bytes of one) on the Vulkan device with the ML emulation layers
    and returns its outputs. ``inputs`` are in the VGF's input order, each with the shape and dtype
    the VGF declares; a mismatch raises ``ScenarioError`` before anything runs."""
    with tempfile.TemporaryDirectory(prefix="etkit-vgf-run-") as tmp:
        work = Path(workdir) if workdir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if isinstance(vgf, bytes):
            vgf_path = work / "model.vgf"
            vgf_path.write_bytes(vgf)
        else:
            vgf_path = Path(vgf).resolve()
        scenario = scenario_template(vgf_path)
        input_specs, output_specs = vgf_ports(vgf_path, scenario)
        if len(inputs) != len(input_specs):
            raise ScenarioError(f"the VGF takes {len(input_specs)} inputs, got {len(inputs)}")
        for index, (array, spec) in enumerate(zip(inputs, input_specs, strict=True)):
            dtype = FORMAT_DTYPES.get(spec.format)
            if tuple(array.shape) != spec.dims or array.dtype != dtype:
                raise ScenarioError(
                    f"input {index}: the VGF wants {spec.format} {list(spec.dims)}, got "
                    f"{array.dtype} {list(array.shape)}"
                )
            path = work / f"input_{index}.npy"
            np.save(path, np.ascontiguousarray(array))
            spec.body["src"] = str(path)
        for index, spec in enumerate(output_specs):
            spec.body["dst"] = str(work / f"output_{index}.npy")
        for resource in scenario["resources"]:
            if "graph" in resource:
                resource["graph"]["src"] = str(vgf_path)
        scenario_path = work / "scenario.json"
        scenario_path.write_text(json.dumps(scenario, indent=1))
        _scenario_runner([str(scenario_path)], work, "")
        results = []
        for spec in output_specs:
            raw = np.ascontiguousarray(np.load(str(spec.body["dst"]))).reshape(-1).view(np.uint8)
            results.append(raw.view(FORMAT_DTYPES[spec.format]).reshape(spec.dims))
        return results


def _scenario_runner(arguments: list[str], work: Path, what: str) -> None:
    """Runs ``scenario_runner --scenario ARGUMENTS...`` in ``work`` with the ML emulation
    layers; ``ScenarioError`` with its output's tail when it fails."""
    done = subprocess.run(
        [find_tool("scenario_runner"), "--scenario", *arguments],
        capture_output=True,
        text=True,
        check=False,
        env=ml_emulation_env(),
        cwd=work,
    )
    if done.returncode != 0:
        raise ScenarioError(
            f"scenario_runner failed{what} (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )


def run_scenario(
    folder: Path | str,
    inputs: Sequence[Any] | None = None,
    *,
    output_dir: Path | str | None = None,
) -> list[npt.NDArray[Any]]:
    """Runs the scenario an export wrote (``scenario/``: ``scenario.json`` and
    ``etkit_scenario.json``, see ``etkit_exporter.vgf.scenario_writer``) in one ``scenario_runner``
    process on the Vulkan device with the ML emulation layers, and returns the program's
    outputs as the ``.pte`` returns them: their logical shapes, laid out in their dim orders
    (numpy views of the memory-order ``output_K.npy``).

    ``inputs``: other values for the program's inputs (arrays or tensors of its IO dtypes and
    logical shapes), used in place of the folder's ``input_K.npy`` (the folder is left as it
    is); ``output_dir``: where the run writes ``output_K.npy`` (a temporary folder when
    ``None``). Raises ``ScenarioError`` when the folder is not a scenario or the run fails,
    ``ValueError`` for inputs of the wrong count, shape or dtype."""

    folder = Path(folder)
    sidecar_path, scenario_path = folder / SIDECAR_JSON, folder / SCENARIO_JSON
    if not sidecar_path.is_file() or not scenario_path.is_file():
        raise ScenarioError(
            f"{folder} is not an etkit scenario folder (no {SCENARIO_JSON} and {SIDECAR_JSON}); "
            "export with scenario=True (etkit-export ... --scenario)"
        )
    sidecar = json.loads(sidecar_path.read_text())

    def entries(kind: str) -> list[ScenarioIO]:
        return [
            ScenarioIO(
                e["index"],
                e["value"],
                e["resource"],
                e["file"],
                tuple(e["shape"]),
                tuple(e["dim_order"]),
                e["dtype"],
                tuple(e["memory_shape"]),
                e.get("image"),
            )
            for e in sidecar[kind]
        ]

    ins, outs = entries("inputs"), entries("outputs")
    with tempfile.TemporaryDirectory(prefix="etkit-scenario-run-") as tmp:
        work = Path(tmp)
        scenario_file = scenario_path.resolve()
        if inputs is not None:
            if len(inputs) != len(ins):
                raise ValueError(f"the scenario takes {len(ins)} inputs, got {len(inputs)}")
            scenario = json.loads(scenario_path.read_text())
            replaced = {}
            for value, io in zip(inputs, ins, strict=True):
                path = work / io.file
                np.save(path, memory_order(value, io))
                replaced[io.file] = str(path)
            base = folder.resolve()
            for resource in scenario["resources"]:
                ((_, body),) = resource.items()
                src = body.get("src")
                if isinstance(src, str):
                    body["src"] = replaced.get(src, str(base / src))
            scenario_file = work / SCENARIO_JSON
            scenario_file.write_text(json.dumps(scenario, indent=1))
        out = Path(output_dir) if output_dir is not None else work / "out"
        out.mkdir(parents=True, exist_ok=True)
        _scenario_runner(
            [str(scenario_file), "--output", str(out.resolve())], work, f" on {scenario_path}"
        )
        results = []
        for io in outs:
            memory = np.load(out / io.file).reshape(io.memory_shape)
            inverse = tuple(int(k) for k in np.argsort(io.dim_order))
            results.append(np.transpose(memory, inverse))
        return results
