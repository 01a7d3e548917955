"""One Vulkan scenario per export: the whole program, VGF graphs and grid-sampler shader chained
on the device, as Arm's ``scenario_runner`` runs it (docs/scenario.md).

``write_scenario`` turns a ``.pte`` (one method, ``forward`` unless told, read with
``etkit_pterunner.PteProgram``) into a folder:

- ``scenario.json``: the resources and commands, in the program's instruction order: one
  ``dispatch_vgf`` per VGF delegate call, one ``dispatch_compute`` per grid-sampler delegate
  call, and between them the memory barriers Vulkan requires;
- ``vgf_K.vgf``: the processed bytes of VGF delegate K;
- ``grid_sample.spv``: the grid-sampler kernel (``etkit_gridsampler.vulkan.spirv()``) and
  ``sampler_K_params.npy``: the parameter block of grid-sampler delegate K
  (``KernelDispatch.params_bytes()``, padded to 4 bytes);
- ``input_K.npy``: the program's inputs, in its IO types and in memory order (a channels-last
  input ``[N, C, H, W]`` is stored ``[N, H, W, C]``); the run writes ``output_K.npy`` the same way;
- ``etkit_scenario.json``: what the folder holds, for ``run_scenario`` and the report.

Every program value gets its own memory. A value that is read or written under more than one
resource (a VGF's tensor and the shader's storage buffer; the program's IO tensor and a VGF's
view of it with other dims; an image view of a texture input) lives in one memory group, so the
resources alias the same bytes: nothing is copied. Kernel instructions that only reinterpret
memory (views, dim-order copies that keep the bytes) become aliases too; anything else the
scenario runner cannot express is refused with ``ScenarioUnsupportedError`` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt
import torch

from etkit_exporter.vgf.scenario_format import (
    RUN_SCRIPT,
    RUN_SCRIPT_TEXT,
    SCENARIO_DIR,
    SCENARIO_JSON,
    SIDECAR_JSON,
    ScenarioPlan,
    ScenarioUnsupportedError,
    memory_order,
    npy_bytes,
)
from etkit_exporter.vgf.scenario_plan import ScenarioBuilder
from etkit_pterunner import MethodInfo, PteProgram


def plan_scenario(
    pte: bytes | Path | MethodInfo,
    io_params: Mapping[str, Any] | None = None,
    method: str = "forward",
) -> ScenarioPlan:
    """The scenario of ``pte`` (the bytes or the path of a ``.pte``, or a method read from one)
    without writing anything. ``io_params`` (io_quant_params.json's content) marks the
    texture-like IO. Raises ``ScenarioUnsupportedError`` naming every construct the scenario
    runner cannot express."""

    if isinstance(pte, MethodInfo):
        return ScenarioBuilder(pte, io_params).plan()
    program = PteProgram.load(pte) if isinstance(pte, Path) else PteProgram.from_bytes(bytes(pte))
    return ScenarioBuilder(program.method(method), io_params).plan()


def write_scenario(
    folder: Path,
    pte: bytes | Path | MethodInfo,
    inputs: Sequence[torch.Tensor | npt.NDArray[Any]],
    io_params: Mapping[str, Any] | None = None,
    method: str = "forward",
) -> dict[str, Any]:
    """Writes the scenario of ``pte`` (its ``method``) into ``folder`` (created; it must not
    exist or be empty) with ``inputs`` (the program's inputs: its IO dtypes, logical shapes) as
    ``input_K.npy``.
    Returns the summary (also written as ``etkit_scenario.json``). Raises
    ``ScenarioUnsupportedError`` before writing anything when the program holds a construct the
    scenario runner cannot express."""
    plan = plan_scenario(pte, io_params, method)
    if len(inputs) != len(plan.inputs):
        raise ValueError(f"the program takes {len(plan.inputs)} inputs, got {len(inputs)}")
    arrays = [memory_order(value, io) for value, io in zip(inputs, plan.inputs, strict=True)]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty")
    files = dict(plan.files)
    for array, io in zip(arrays, plan.inputs, strict=True):
        files[io.file] = npy_bytes(array)
    files[RUN_SCRIPT] = RUN_SCRIPT_TEXT.encode()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    script = folder / RUN_SCRIPT
    script.chmod(script.stat().st_mode | (0o111 & (script.stat().st_mode >> 2)))  # +x as +r
    (folder / SCENARIO_JSON).write_text(json.dumps(plan.scenario, indent=1) + "\n")
    summary = plan.summary()
    summary["files"] = {
        name: len(data) for name, data in sorted({**files, SCENARIO_JSON: b""}.items())
    }
    summary["files"][SCENARIO_JSON] = (folder / SCENARIO_JSON).stat().st_size
    summary["bytes"] = sum(summary["files"].values())
    (folder / SIDECAR_JSON).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def scenario_report(
    summary: Mapping[str, Any] | None, refused: ScenarioUnsupportedError | None = None
) -> dict[str, Any]:
    """The report's ``scenario`` section: what the scenario holds (dispatches, resources,
    bytes) and how to run it, or why there is none."""
    if summary is None:
        return {
            "written": False,
            "reason": str(refused) if refused is not None else "not asked for",
            "refused": list(refused.reasons) if refused is not None else [],
        }
    return {
        "written": True,
        "folder": SCENARIO_DIR,
        "dispatches": [
            {
                key: d[key]
                for key in ("command", "instruction", "delegate", "backend", "file", "rangeND")
                if key in d
            }
            for d in summary["dispatches"]
        ],
        "commands": summary["commands"],
        "resources": summary["resources"],
        "memory_groups": summary["memory_groups"],
        "memory_bytes": summary["memory_bytes"],
        "files": summary["files"],
        "bytes": summary.get("bytes"),
        "aliases": summary["aliases"],
        "notes": summary["notes"],
        "inputs": [io["file"] for io in summary["inputs"]],
        "outputs": [io["file"] for io in summary["outputs"]],
        "run": [
            f"sh {SCENARIO_DIR}/{RUN_SCRIPT} OUT",
            f"etkit run --scenario {SCENARIO_DIR}/",
            "python -c 'from etkit_exporter.vgf.scenario import run_scenario; "
            f'print(run_scenario("{SCENARIO_DIR}"))\'',
        ],
    }


def scenario_markdown(section: Mapping[str, Any]) -> list[str]:
    """report.md's "Vulkan scenario" lines for a ``scenario_report`` section."""
    lines = ["## Vulkan scenario", ""]
    if not section.get("written"):
        lines += [f"No scenario was written: {section.get('reason')}", ""]
        return lines
    commands = ", ".join(f"{n} {kind}" for kind, n in section["commands"].items())
    resources = ", ".join(f"{n} {kind}" for kind, n in section["resources"].items())
    lines += [
        f"`{section['folder']}/`: {commands}; resources: {resources}; "
        f"{section['memory_groups']} memory groups (aliasing); device memory "
        f"{section['memory_bytes']} bytes; files {section['bytes']} bytes.",
        "",
        "| command | instruction | delegate | backend | file | workgroups |",
        "|---|---|---|---|---|---|",
    ]
    for d in section["dispatches"]:
        groups = "x".join(str(g) for g in d.get("rangeND", [])) or "-"
        lines.append(
            f"| {d['command']} | {d['instruction']} | {d['delegate']} | {d['backend']} | "
            f"{d['file']} | {groups} |"
        )
    lines += ["", "Run it (the script loads Arm's ML emulation layers, as etkit does):", "", "```"]
    lines += [
        f"sh {section['folder']}/{RUN_SCRIPT} OUT",
        f"etkit run --scenario {section['folder']}/ --out OUT",
        "```",
        "",
        "On a device whose Vulkan driver implements VK_ARM_tensors and VK_ARM_data_graph itself: "
        f"`scenario_runner --scenario {section['folder']}/{SCENARIO_JSON} --output OUT`.",
        "",
    ]
    return lines
