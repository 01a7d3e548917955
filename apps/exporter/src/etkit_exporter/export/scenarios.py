"""The export's Vulkan scenarios (``--scenario``): one per method of the written program, each
written by ``etkit_exporter.vgf.scenario_writer`` and checked against the program's method run
by etkit's runner before it is kept."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from etkit_exporter.check.bundle import BundleCase
from etkit_exporter.core.io_params import program_input
from etkit_exporter.export.methods import why_different
from etkit_exporter.programs import load_program
from etkit_exporter.vgf.scenario import run_scenario
from etkit_exporter.vgf.scenario_format import SCENARIO_DIR, ScenarioUnsupportedError
from etkit_exporter.vgf.scenario_writer import scenario_report, write_scenario

logger = logging.getLogger(__name__)


def export_scenario(
    artifacts: Path,
    example_inputs: Sequence[torch.Tensor],
    io_params: Mapping[str, Any],
    method: str = "forward",
    runs: Sequence[BundleCase] = (),
) -> dict[str, Any]:
    """The export pipeline's hook: writes the scenario of ``artifacts/model.pte``'s ``method``
    (``scenario_folder``) with the example inputs in the program's IO types and layouts
    (quantized through ``io_params``, that method's table), checks it (``checked_scenario``;
    ``runs``: runs of the program the export already made, its verification's)
    and returns the report's ``scenario`` section (``scenario_report``). A program the scenario
    runner cannot express gets no folder; the section says why."""

    inputs = [
        program_input(x, entry)
        for x, entry in zip(example_inputs, io_params["inputs"], strict=True)
    ]
    folder = artifacts / scenario_folder(method)
    try:
        summary = write_scenario(folder, artifacts / "model.pte", inputs, io_params, method)
    except ScenarioUnsupportedError as error:
        logger.warning("%s", error)
        return scenario_report(None, error)
    section = scenario_report(summary)
    section["folder"] = folder.name
    known = next((run for run in runs if run.method == method), None)
    return checked_scenario(artifacts, folder, inputs, method, section, known)


def scenario_folder(method: str) -> str:
    """The folder of ``method``'s scenario: ``scenario`` for ``forward``, ``scenario_NAME`` for
    another method (an export of several sizes: ``scenario_forward_720x1280``)."""
    return SCENARIO_DIR if method == "forward" else f"{SCENARIO_DIR}_{method}"


def checked_scenario(
    artifacts: Path,
    folder: Path,
    inputs: Sequence[torch.Tensor],
    method: str,
    section: dict[str, Any],
    known: BundleCase | None = None,
) -> dict[str, Any]:
    """The written scenario run on ``inputs`` against the program's ``method`` run by etkit's
    runner: a scenario whose outputs differ in any byte is removed (this export wrote it) and
    the report says so, with the numbers; never a scenario known to compute something else.
    ``known``: a run of that method the export already made (its verification's); its outputs
    are taken when its inputs are ``inputs``, bit for bit, instead of running the program again
    (on VGF, a ``scenario_runner`` process: seconds)."""
    if (
        known is not None
        and len(known.inputs) == len(inputs)
        and why_different(known.inputs, inputs) is None
    ):
        expected = [o.contiguous() for o in known.expected]
    else:
        program = load_program(artifacts / "model.pte")
        expected = [o.contiguous() for o in program.run(list(inputs), method).outputs]
    got = run_scenario(folder, list(inputs))
    differing = []
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        b_tensor = torch.from_numpy(b.copy())
        if a.shape != b_tensor.shape or not torch.equal(a, b_tensor.to(a.dtype)):
            count = int((a != b_tensor.reshape(a.shape)).sum()) if a.numel() == b.size else -1
            differing.append(f"output {index}: {count} of {a.numel()} values")
    section["checked"] = "the scenario's outputs equal the program's on the example inputs"
    if not differing:
        return section
    shutil.rmtree(folder)
    reason = (
        "no scenario: the written scenario's outputs differ from the program's on the example "
        "inputs (" + "; ".join(differing) + "): not kept"
    )
    logger.warning("%s", reason)
    return {"written": False, "reason": reason, "refused": [reason]}
