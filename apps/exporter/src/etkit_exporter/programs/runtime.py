"""Running a program in ``executorch.runtime`` (the grid-sampler backend registered), with an
ETDump, and whether that runtime has every backend a program names.

A run with an ETDump runs in a child process: ExecuTorch's ETDump writer aborts its process when
the debug buffer cannot hold what the run logs, and a native abort there must not end the
caller (``etkit inspect``, a verification's localization). The buffer is sized from the
program's instructions (``etdump_buffer_size``); a child that still runs out of space is run
again with a larger one, and any other abort is one line of ``EtdumpRunError``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, cast

import torch
from executorch.runtime import Runtime

from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND
from etkit_exporter.core.errors import InspectError
from etkit_gridsampler import runtime as grid_sampler_runtime
from etkit_gridsampler.delegate_format import decode
from etkit_pterunner import ListInfo, MethodInfo, PteProgram, TensorInfo, resolve_operator
from etkit_pterunner.kernels import Frame

# ExecuTorch's XNNPACK delegate logs timings only inside its calls, no tensors
_XNNPACK_BACKEND: Final = "XnnpackBackend"
# ETDumpGen places each tensor it logs at a 64-byte boundary of the debug buffer
_ALIGNMENT: Final = 64
_MARGIN: Final = 1 << 20
# What ExecuTorch's buffer data sink logs before ETDumpGen aborts the process
_OUT_OF_SPACE: Final = "Ran out of space to store intermediate outputs"
# a child that ran out of space runs again with twice the buffer, at most this many times
_RETRIES: Final = 3
# ExecuTorch's log lines: "[method.cpp:123] message" (the pip wheel) or
# "E 00:00:01.234567 executorch:method.cpp:123] message"
_NATIVE_LINE: Final = re.compile(r"^(?:\[|[EFWI] \d\d:\d\d:\d\d\.\d+ )[\w.:/-]+:\d+\] ?(.*)$")
_CHILD: Final = (
    "import sys\n"
    "from etkit_exporter.programs.runtime import _etdump_child\n"
    "sys.exit(_etdump_child(sys.argv[1:]))\n"
)
_CHILD_FAILED: Final = 3  # the child's exit status when it wrote its error to error.txt


class EtdumpRunError(InspectError, RuntimeError):
    """A run with an ETDump failed: the program did not load or run, or the runtime aborted
    (the message, one line, says which). An ``InspectError`` for ``etkit inspect``, and a
    ``RuntimeError`` as ``executorch.runtime``'s own failures are."""


class _MethodLists:
    """The tensor lists of a method as a kernel's ``written`` reads them; nothing runs."""

    def __init__(self, method: MethodInfo) -> None:
        self.values = method.values

    def list_items(self, index: int) -> tuple[int, ...] | None:
        value = self.values[index]
        if isinstance(value, ListInfo) and value.kind in ("tensor", "optional_tensor"):
            return tuple(int(item) for item in value.items)
        return None


def _logged_bytes(method: MethodInfo, indices: Sequence[int]) -> int:
    """Debug-buffer bytes of the tensors at ``indices`` (a tensor list: each of its tensors)."""
    total = 0
    for index in indices:
        if index < 0:
            continue
        value = method.values[index]
        if isinstance(value, TensorInfo):
            total += value.nbytes + _ALIGNMENT
        elif isinstance(value, ListInfo) and value.kind in ("tensor", "optional_tensor"):
            total += _logged_bytes(method, [int(item) for item in value.items])
    return total


def etdump_buffer_size(pte: Path, method: str = "forward") -> int:
    """Bytes for the ETDump debug buffer of a run of ``method`` of ``pte``: every tensor the
    run logs, each at a 64-byte boundary, plus 1 MiB. At the debug level of a debug buffer,
    ExecuTorch (1.5.1, ``Method::execute``) logs each kernel call's outputs; every argument of
    each delegate call, since it cannot tell its inputs from its outputs (inputs, outputs,
    constants: a value read by k calls is logged k times); what a delegate logs inside its
    call (etkit's grid sampler: its output; XNNPACK: no tensor; any other backend: taken as
    each of its arguments once more); and the method's outputs once more at the end. A
    program without ``method`` needs none (it cannot run)."""

    program = PteProgram.load(pte)
    if method not in program.method_names:
        return _ALIGNMENT + _MARGIN
    info = program.method(method)
    lists = cast(Frame, _MethodLists(info))
    total = _logged_bytes(info, info.outputs)
    for chain in info.chains:
        for instruction in chain:
            if instruction.kind == "kernel":
                kernel = resolve_operator(info.operators[instruction.operator])
                written = (
                    instruction.args
                    if isinstance(kernel, str)
                    else kernel.written(lists, instruction.args)
                )
                total += _logged_bytes(info, written)
            elif instruction.kind == "delegate":
                delegate = info.delegates[instruction.delegate]
                total += _logged_bytes(info, instruction.args)
                if delegate.backend_id == GRID_SAMPLER_BACKEND:
                    inputs = decode(delegate.processed).roles.inputs
                    total += _logged_bytes(info, instruction.args[inputs:])
                elif delegate.backend_id != _XNNPACK_BACKEND:
                    total += _logged_bytes(info, instruction.args)
    return total + _ALIGNMENT + _MARGIN


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
    isolated: bool = True,
) -> tuple[list[Any], float]:
    """Runs ``pte`` in ``executorch.runtime`` (the grid-sampler backend registered) with an
    ETDump, written to ``etdump``; with ``debug_buffer`` the intermediate outputs too, written
    there (in a buffer of ``debug_buffer_size`` bytes, ``etdump_buffer_size`` by default).
    Returns the outputs and the seconds ``execute`` took.

    ``isolated`` (``etkit inspect``, ``etkit run``): the run is a child process's: a buffer too
    small for what the run logs (which aborts that process) is doubled and the run done again,
    up to three times; any other failure, the program's own error or a native abort, raises
    ``EtdumpRunError``, one line. Not isolated (a verification, which runs one on every
    XNNPACK export): in this process, with twice ``etdump_buffer_size`` (which matches what
    ExecuTorch 1.5.1 logs to within its alignment: 111,722,285 bytes estimated for 111,712,432
    logged by an IFNet at 256x448), saving the child's 6-8 s of imports."""

    size = 0
    if debug_buffer is not None:
        size = debug_buffer_size if debug_buffer_size is not None else etdump_buffer_size(pte)
    etdump.parent.mkdir(parents=True, exist_ok=True)
    if not isolated:
        with tempfile.TemporaryDirectory(prefix="etkit-etdump-") as scratch:
            debug = debug_buffer if debug_buffer is not None else Path(scratch) / "debug.bin"
            failure = _run_here(pte, list(inputs), str(etdump), str(debug), 2 * size)
            if isinstance(failure, str):
                raise EtdumpRunError(failure)
            return failure
    with tempfile.TemporaryDirectory(prefix="etkit-etdump-") as scratch:
        folder = Path(scratch)
        torch.save(list(inputs), folder / "inputs.pt")
        debug = debug_buffer if debug_buffer is not None else folder / "debug.bin"
        paths = [str(pte), scratch, str(etdump), str(debug)]
        for attempt in range(_RETRIES + 1):
            child = subprocess.run(
                [sys.executable, "-c", _CHILD, *paths, str(size)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                check=False,
            )
            if size and _OUT_OF_SPACE in child.stderr and attempt < _RETRIES:
                size *= 2
                continue
            _echo_native_log(child.stderr)
            if child.returncode == 0:
                result = torch.load(folder / "outputs.pt", weights_only=True)
                return list(result["outputs"]), float(result["seconds"])
            raise EtdumpRunError(_child_failure(pte, child, folder, size, attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _echo_native_log(text: str) -> None:
    """Writes the runtime's log lines of a child to this process's stderr (where a caller may
    be capturing them), as the runtime would have written them in this process."""
    lines = [line for line in text.splitlines() if _NATIVE_LINE.match(line.strip())]
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()


def _child_failure(
    pte: Path, child: subprocess.CompletedProcess[str], folder: Path, size: int, retries: int
) -> str:
    """One line saying why the child running ``pte`` failed."""
    error = folder / "error.txt"
    if child.returncode == _CHILD_FAILED and error.is_file() and error.read_text().strip():
        return error.read_text().strip().splitlines()[0]
    if _OUT_OF_SPACE in child.stderr:
        again = f" (run {retries + 1} times, the buffer doubled each time)" if retries else ""
        return (
            f"{pte}: the ETDump debug buffer of {size} bytes ran out of space for the run's "
            f"intermediate outputs{again}"
        )
    if child.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-child.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-child.returncode}"
    else:
        how = f"exited with status {child.returncode}"
    native = [m[1] for line in child.stderr.splitlines() if (m := _NATIVE_LINE.match(line))]
    lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
    last = native[-1] if native else (lines[-1] if lines else "")
    return f"{pte}: executorch.runtime {how} running it with an ETDump" + (
        f": {last}" if last else ""
    )


def _etdump_child(argv: Sequence[str]) -> int:
    """The child of ``run_with_etdump``: ``PTE SCRATCH ETDUMP DEBUG SIZE``; reads
    ``SCRATCH/inputs.pt``, writes ``SCRATCH/outputs.pt`` (the outputs and the seconds
    ``execute`` took), or ``SCRATCH/error.txt`` and exits 3 when the program fails."""

    pte, folder, etdump, debug, size = Path(argv[0]), Path(argv[1]), argv[2], argv[3], argv[4]
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    result = _run_here(pte, inputs, etdump, debug, int(size))
    if isinstance(result, str):
        (folder / "error.txt").write_text(result + "\n")
        return _CHILD_FAILED
    outputs, seconds = result
    torch.save({"outputs": outputs, "seconds": seconds}, folder / "outputs.pt")
    return 0


def _run_here(
    pte: Path, inputs: list[Any], etdump: str, debug: str, size: int
) -> tuple[list[Any], float] | str:
    """One run of ``pte`` with an ETDump in this process: the outputs and the seconds
    ``execute`` took, or the program's error in one line."""
    grid_sampler_runtime.register()
    try:
        program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=size)
        method = program.load_method("forward")
        if method is None:
            raise InspectError(f"{pte}: no method 'forward'")
        began = time.perf_counter()
        outputs = list(method.execute(list(inputs)))
        seconds = time.perf_counter() - began
        program.write_etdump_result_to_file(etdump, debug)
    except (RuntimeError, ValueError) as error:
        return f"{error}" if str(error) else f"{error!r}"
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
