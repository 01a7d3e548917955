"""Running a program in ``executorch.runtime`` (the grid-sampler backend registered), with an
ETDump, and whether that runtime has every backend a program names."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from executorch.runtime import Runtime

from etkit_exporter.core.errors import InspectError
from etkit_gridsampler import runtime as grid_sampler_runtime
from etkit_pterunner import PteProgram, TensorInfo


def etdump_buffer_size(pte: Path) -> int:
    """Bytes for an ETDump debug buffer that holds every intermediate output of a run of
    ``pte``: each tensor value of the program twice (an instruction's output, and a delegate's
    own event's), aligned, plus 1 MiB. The runtime aborts when the buffer is too small."""

    total = 0
    program = PteProgram.load(pte)
    for name in program.method_names:
        for info in program.method(name).values:
            if isinstance(info, TensorInfo):
                total += info.nbytes + 64
    return 2 * total + (1 << 20)


def runtime_method(program: Path | bytes, method: str = "forward") -> Any:
    """``method`` of ``program`` (a ``.pte`` file or its bytes) loaded in ``executorch.runtime``,
    etkit's grid-sampler backend registered; ``None`` when the program has no such method."""
    grid_sampler_runtime.register()
    return Runtime.get().load_program(program).load_method(method)


def run_with_etdump(
    pte: Path,
    inputs: Sequence[torch.Tensor],
    etdump: Path,
    debug_buffer: Path | None = None,
    *,
    debug_buffer_size: int | None = None,
) -> tuple[list[Any], float]:
    """Runs ``pte`` in ``executorch.runtime`` (the grid-sampler backend registered) with an
    ETDump, written to ``etdump``; with ``debug_buffer`` the intermediate outputs too, written
    there (in a buffer of ``debug_buffer_size`` bytes, ``etdump_buffer_size`` by default).
    Returns the outputs and the seconds ``execute`` took."""

    grid_sampler_runtime.register()
    size = 0
    if debug_buffer is not None:
        size = debug_buffer_size if debug_buffer_size is not None else etdump_buffer_size(pte)
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=size)
    method = program.load_method("forward")
    if method is None:
        raise InspectError(f"{pte}: no method 'forward'")
    began = time.perf_counter()
    outputs = list(method.execute(list(inputs)))
    seconds = time.perf_counter() - began
    etdump.parent.mkdir(parents=True, exist_ok=True)
    if debug_buffer is None:
        with tempfile.TemporaryDirectory() as scratch:
            program.write_etdump_result_to_file(str(etdump), str(Path(scratch) / "debug.bin"))
    else:
        program.write_etdump_result_to_file(str(etdump), str(debug_buffer))
    return outputs, seconds


def runtime_can_run(program: Any) -> bool:
    """Whether ``executorch.runtime`` has every backend the delegates of ``program`` (a
    ``PteProgram``, or the path of a ``.pte``) name, the grid-sampler backend registered:
    XNNPACK exports yes, VGF exports no."""

    if not isinstance(program, PteProgram):
        program = PteProgram.load(program)
    grid_sampler_runtime.register()
    registered = set(Runtime.get().backend_registry.registered_backend_names)
    return {d.backend_id for d in program.delegates} <= registered
