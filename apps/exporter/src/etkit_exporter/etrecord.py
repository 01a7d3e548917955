"""``etrecord.bin``: the ETRecord of an export, for ExecuTorch's Inspector.

It holds the programs as the export made them (the ATen program that was lowered, the edge
program, for VGF the edge program after the channels-last pass), the final program's debug-handle
and delegate maps, and the representative inputs (the example inputs) that
``Inspector.calculate_numeric_gap`` runs the reference graph on. The stack traces in node
metadata name source files: their absolute paths are cut to the part below the import root
(``etkit_exporter/demos.py``), or to the file name, so that the record holds no path of the build
machine; ``build_paths_in`` checks what is left.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import torch

ETRECORD_NAME: Final = "etrecord.bin"

# Absolute paths in a stack trace line: 'File "/abs/path/x.py", line 3, in forward'
_FILE_IN_TRACE: Final = re.compile(r'File "([^"]+)"')
# What no shipped artifact may name: the usual roots of build machines' working folders
_BUILD_ROOTS: Final = ("/work/", "/tmp/", "/home/", "/root/", "/Users/", "/var/folders/")


def _import_roots() -> list[str]:
    roots = {str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()}
    return sorted(roots, key=len, reverse=True)


def portable_file_name(path: str, roots: Sequence[str] | None = None) -> str:
    """``path`` without the build machine's part: relative to the longest import root holding it
    (``etkit_exporter/demos.py``), else its file name. Relative paths and pseudo files
    (``<string>``) are kept."""
    if not os.path.isabs(path):
        return path
    for root in _import_roots() if roots is None else roots:
        if path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1 :]
    return os.path.basename(path)


def portable_stack_trace(trace: str, roots: Sequence[str] | None = None) -> str:
    """A stack trace with every ``File "..."`` made portable (``portable_file_name``)."""
    found = _import_roots() if roots is None else roots
    return _FILE_IN_TRACE.sub(lambda m: f'File "{portable_file_name(m.group(1), found)}"', trace)


def _programs(record: Any) -> Iterable[Any]:
    edge = record.edge_dialect_program
    yield record.exported_program
    yield from edge.values() if isinstance(edge, dict) else (edge,)
    yield from (record.graph_map or {}).values()


def strip_stack_trace_paths(record: Any) -> int:
    """Makes the stack traces of every node of every program in ``record`` portable, nested
    graphs included; returns how many traces changed."""
    roots = _import_roots()
    changed = 0
    seen: set[int] = set()
    for program in _programs(record):
        if program is None or id(program) in seen:
            continue
        seen.add(id(program))
        for module in program.graph_module.modules():
            graph = getattr(module, "graph", None)
            if not isinstance(graph, torch.fx.Graph):
                continue
            for node in graph.nodes:
                trace = node.meta.get("stack_trace")
                if isinstance(trace, str):
                    portable = portable_stack_trace(trace, roots)
                    if portable != trace:
                        node.meta["stack_trace"] = portable
                        changed += 1
    return changed


def build_paths_in(data: bytes, extra: Iterable[str | Path] = ()) -> list[str]:
    """The build-machine paths found in ``data`` (an artifact's bytes): the working folder, the
    home and temporary folders, the virtual environment, ``extra``, and anything under the usual
    roots of build folders (``/work/``, ``/tmp/``, ``/home/``, ...)."""
    candidates = {
        os.getcwd(),
        str(Path.home()),
        tempfile.gettempdir(),
        sys.prefix,
        *(str(p) for p in extra),
    }
    needles = sorted({c for c in candidates if len(c) > 1} | set(_BUILD_ROOTS))
    return [needle for needle in needles if needle.encode() in data]


def etrecord_bytes(
    executorch_manager: Any,
    representative_inputs: Sequence[torch.Tensor],
    *,
    forbidden_paths: Iterable[str | Path] = (),
) -> bytes:
    """The ETRecord of ``executorch_manager`` (the result of ``to_executorch()`` on a program
    lowered with ``generate_etrecord=True``) with ``representative_inputs`` and portable stack
    traces, serialized. Raises ``RuntimeError`` if a build-machine path is left in it."""
    record = executorch_manager.get_etrecord()
    record.update_representative_inputs([x.detach().clone() for x in representative_inputs])
    strip_stack_trace_paths(record)
    buffer = io.BytesIO()
    record.save(buffer)
    data = buffer.getvalue()
    leaks = build_paths_in(data, forbidden_paths)
    if leaks:
        raise RuntimeError(
            f"the ETRecord names paths of this machine ({', '.join(leaks)}); etkit strips them "
            "from stack traces, so another part of the record holds them"
        )
    return data
