"""``etrecord.bin``: the ETRecord of an export, for ExecuTorch's Inspector.

By default ("slim", ``RECORD_CONTENTS``) it holds the edge program as lowered (the graph
ExecuTorch's Inspector maps debug handles to and ``etkit inspect`` and the verdict run; also as
``edge_after_transform/forward`` when the transform passes changed it), the final program's
debug-handle and delegate maps, and the representative inputs (the example inputs) that
``Inspector.calculate_numeric_gap`` runs the reference graph on. "full" adds the ATen program
that was lowered (the Inspector's first choice of reference graph; it falls back to the edge
program without it) and the float model as captured (``float_model/forward``, which ``etkit
inspect`` compares each value with). Members are deflated. For the RIFE IFNet re-creation at
256x448 (XNNPACK, a 6.6 MB program) the record was 111.3 MB: three copies of the weights, two
of them with the float weights PT2E had folded into int8 (``drop_unread_state`` now drops those
at capture), the float model's, stored uncompressed. The stack traces in node
metadata name source files: their absolute paths are cut to the part below the import root
(``etkit_exporter/demos.py``), or to the file name, so that the record holds no path of the build
machine; ``build_paths_in`` checks what is left.

``etrecord.json`` beside it (``instruction_map``) says, for each instruction of the program,
which node of ``edge_after_transform/forward`` computes the value it writes: for a delegate
call, the outputs of the subgraph it was lowered from. ``etkit inspect`` compares each
instruction's runtime output with that node's value in the quantized graph and, through the
node's origin in the float model, with the float model's.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from executorch.exir.delegate import executorch_call_delegate

logger = logging.getLogger(__name__)

ETRECORD_NAME: Final = "etrecord.bin"
INSTRUCTION_MAP_NAME: Final = "etrecord.json"
INSTRUCTION_MAP_FORMAT: Final = 1
# What etrecord.bin holds: "slim" what the Inspector and etkit inspect need, "full" also the
# ATen program and the float model
RECORD_CONTENTS: Final = ("slim", "full")
FLOAT_MODEL: Final = "float_model"  # its graph_map key: "float_model/forward"
REFERENCE_GRAPH: Final = "edge_after_transform/forward"

# Absolute paths in a stack trace line: 'File "/abs/path/x.py", line 3, in forward'
_FILE_IN_TRACE: Final = re.compile(r'File "([^"]+)"')
# What no shipped artifact may name: the usual roots of build machines' working folders
_BUILD_ROOTS: Final = ("/work/", "/tmp/", "/home/", "/root/", "/Users/", "/var/folders/")
# a path this long names one folder: found anywhere in an artifact's bytes, it is a leak
_WHOLE_PATH: Final = 12


def _import_roots() -> list[str]:
    roots = {str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()}
    return sorted(roots, key=len, reverse=True)


def portable_file_name(path: str, roots: Sequence[str] | None = None) -> str:
    """``path`` without the build machine's part: relative to the longest import root holding it
    (``etkit_exporter/demos.py``), else its file name. Relative paths and pseudo files
    (``<string>``) are kept."""
    if not Path(path).is_absolute():
        return path
    for root in _import_roots() if roots is None else roots:
        if path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1 :]
    return Path(path).name


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
    roots of build folders (``/work/``, ``/tmp/``, ``/home/``, ...). A folder of fewer than
    ``_WHOLE_PATH`` characters counts where a name in it follows (``/tmp/x``): binary data
    holds a short one by chance (a RIFE-shaped export's 16.7 MB of constants held ``/tmp``,
    and its ETRecord was dropped); a longer one counts wherever it appears."""
    candidates = {
        str(Path.cwd()),
        str(Path.home()),
        tempfile.gettempdir(),
        sys.prefix,
        *(str(p) for p in extra),
    }
    needles = sorted({c for c in candidates if len(c) > 1} | set(_BUILD_ROOTS))
    found = []
    for needle in needles:
        folder = needle.rstrip("/").encode()
        if len(folder) >= _WHOLE_PATH:
            named = folder in data
        else:
            named = re.search(re.escape(folder) + rb"/[\w.-]", data) is not None
        if named:
            found.append(needle)
    return found


def etrecord_bytes(
    executorch_manager: Any,
    representative_inputs: Sequence[torch.Tensor],
    *,
    float_program: Any = None,
    forbidden_paths: Iterable[str | Path] = (),
    full: bool = False,
) -> bytes:
    """The ETRecord of ``executorch_manager`` (the result of ``to_executorch()`` on a program
    lowered with ``generate_etrecord=True``) with ``representative_inputs`` and portable stack
    traces, serialized; ``full``: with the ATen program and ``float_program`` (the float model
    as ``torch.export`` captured it, recorded as ``float_model/forward``) too. Raises
    ``RuntimeError`` if a build-machine path is left in it."""
    record = executorch_manager.get_etrecord()
    record.update_representative_inputs([x.detach().clone() for x in representative_inputs])
    graph_map = record.graph_map or {}
    if full and float_program is not None and FLOAT_MODEL + "/forward" not in graph_map:
        record.add_extra_export_modules({FLOAT_MODEL: float_program})
    if not full:
        graph_map.pop(FLOAT_MODEL + "/forward", None)
    strip_stack_trace_paths(record)
    buffer = io.BytesIO()
    record.save(buffer)
    data = slim_record(reproducible_record(buffer.getvalue()), full=full)
    leaks = build_paths_in(data, forbidden_paths)
    if leaks:
        raise RuntimeError(
            f"the ETRecord names paths of this machine ({', '.join(leaks)}); etkit strips them "
            "from stack traces, so another part of the record holds them"
        )
    return data


# In the serialized programs' node provenance (``from_node``): a graph's id is its address in
# memory, and a builtin target's repr names its address too
_GRAPH_ID: Final = re.compile(rb'(\\*"graph_id\\*"\s*:\s*)(\d+)')
_ADDRESS: Final = re.compile(rb" at 0x[0-9a-fA-F]+>")
# FX's generated code in stack traces: "<eval_with_key>.267", numbered per process
_GENERATED_FILE: Final = re.compile(rb"<eval_with_key>\.\d+")
# An ``nn_module_stack`` entry ("key,path,type", entries joined by ";") whose key is a module's
# ``id()`` (torch.export keys a submodule called from the top module's code so), bare or after
# "L__self__" (the capture of the quantized graph module keys its nodes' modules so from the
# first capture's keys: "L__self__140659276218896"): the key is the first field of an entry, at
# the start of the string or after a ";"
_MODULE_ID_KEY: Final = re.compile(rb'([;"](?:L__self__)*)(\d{6,})(,)')
_EXPORT_GRAPH_ID: Final = "export_graph_id"
_FIXED_TIME: Final = (1980, 1, 1, 0, 0, 0)


def reproducible_record(data: bytes) -> bytes:
    """A saved ETRecord (a zip) made the same for the same export on any run: the graph ids in
    its programs' node provenance and its ``export_graph_id`` (addresses in memory) renumbered in
    order of first appearance, the same number for the same id throughout the record (so the
    provenance still matches across its programs); the module ids that key ``nn_module_stack``
    entries renumbered the same way; the addresses in builtin targets' reprs zeroed; the
    per-process number of FX's generated files in stack traces dropped; every member's time
    stamp fixed."""
    numbers: dict[bytes, bytes] = {}
    modules: dict[bytes, bytes] = {}

    def renumber(match: re.Match[bytes]) -> bytes:
        number = numbers.setdefault(match[2], str(len(numbers)).encode())
        return match[1] + number

    def renumber_module(match: re.Match[bytes]) -> bytes:
        return match[1] + modules.setdefault(match[2], str(len(modules)).encode()) + match[3]

    source = zipfile.ZipFile(io.BytesIO(data))
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w") as target:
        for info in source.infolist():
            content = source.read(info)
            if info.filename == _EXPORT_GRAPH_ID:
                value = content.strip()
                content = numbers.setdefault(value, str(len(numbers)).encode())
            elif content[:1] == b"{":  # a program's JSON, not its tensors
                content = _GRAPH_ID.sub(renumber, content)
                content = _MODULE_ID_KEY.sub(renumber_module, content)
                content = _GENERATED_FILE.sub(
                    b"<eval_with_key>", _ADDRESS.sub(b" at 0x0>", content)
                )
            fixed = zipfile.ZipInfo(info.filename, date_time=_FIXED_TIME)
            fixed.compress_type = info.compress_type
            fixed.external_attr = info.external_attr
            target.writestr(fixed, content)
    return output.getvalue()


# The ATen program's members in a saved ETRecord ("exported_program", its "_state_dict", ...)
ATEN_PROGRAM: Final = "exported_program"


EDGE_DIALECT_GRAPH: Final = "edge_dialect_exported_program"
_PROGRAM_PARTS: Final = ("", "_state_dict", "_constants", "_example_inputs")


def slim_record(data: bytes, *, full: bool = True) -> bytes:
    """A saved ETRecord without what it holds twice, deflated: each program's own copy of the
    example inputs (the Inspector runs its reference graph on ``representative_inputs``, kept;
    each program's ``example_inputs`` is only metadata, read back as none), and
    ``edge_after_transform/forward`` when it is byte for byte the edge dialect program (its
    graph, weights and constants), which ``etkit inspect`` then reads instead (for a 544x960
    two-frame model: 80.0 MB before, 25.5 MB after). Without ``full``, the ATen program's
    members are left out too. Every member is deflated (a program's graph, JSON, to 3 %; int8
    weights and float grids to about 70 %)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    names = set(source.namelist())
    edge = f"{EDGE_DIALECT_GRAPH}/forward"
    twin = REFERENCE_GRAPH in names and all(
        edge + part in names and source.read(REFERENCE_GRAPH + part) == source.read(edge + part)
        for part in _PROGRAM_PARTS[:3]
    )
    aten = {ATEN_PROGRAM + part for part in _PROGRAM_PARTS} if not full else set()
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED, compresslevel=_DEFLATE_LEVEL) as target:
        for info in source.infolist():
            if (twin and info.filename.startswith(REFERENCE_GRAPH)) or info.filename in aten:
                continue
            content = source.read(info)
            if info.filename.endswith("_example_inputs"):
                content = b""
            member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            member.external_attr = info.external_attr
            target.writestr(member, content, zipfile.ZIP_DEFLATED, _DEFLATE_LEVEL)
    return output.getvalue()


# zlib's level for the record's members: 1 deflates the IFNet record's weights within 0.3 % of
# level 6's size, 20 % faster
_DEFLATE_LEVEL: Final = 1


def reference_graph_name(data: bytes) -> str:
    """The graph of a saved ETRecord that ``etkit inspect`` compares the program with:
    ``REFERENCE_GRAPH``, or the edge dialect program when ``slim_record`` dropped its twin (the
    name ExecuTorch's Inspector takes as ``reference_graph``)."""
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    return REFERENCE_GRAPH if REFERENCE_GRAPH in names else EDGE_DIALECT_GRAPH


def _op_key(target: object) -> tuple[str, ...]:
    """An operator's namespace and name, overload dropped: ``aten.where.self`` and its out
    variant ``aten.where.self_out`` both give ("aten", "where")."""
    name = getattr(target, "_name", None) or getattr(target, "__name__", None) or str(target)
    parts = str(name).replace("::", ".").split(".")
    return tuple(parts[:2])


def _first_origin(node: torch.fx.Node) -> tuple[str, int] | None:
    sources = node.meta.get("from_node")
    if not sources:
        return None
    return (sources[-1].name, sources[-1].graph_id)


def _meta_signature(node: torch.fx.Node) -> tuple[Any, ...] | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape))
    return None


# Operators that change a tensor's memory layout, not its values (etkit-layout pins delegate
# outputs with them inside the lowered subgraph)
_LAYOUT_OPS: Final = ("clone", "_to_dim_order_copy", "_clone_dim_order")


def _through_layout_ops(node: object, names: set[str]) -> str | None:
    """The name of the reference-graph node whose value ``node`` (a delegate subgraph's
    output) is: itself, or what a chain of layout operators inside the subgraph copies."""
    for _ in range(8):
        if not isinstance(node, torch.fx.Node):
            return None
        if node.name in names:
            return node.name
        if node.op != "call_function" or not any(op in str(node.target) for op in _LAYOUT_OPS):
            return None
        node = node.args[0] if node.args else None
    return None


def _ops_summary(graph: torch.fx.Graph, limit: int = 5) -> str:
    """The operators a delegate was lowered from, most frequent first, without the quantize,
    dequantize and layout copies: ``convolution x2, relu, cat``."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_key(node.target)[-1]
        if any(skip in name for skip in ("quantize", "getitem", *_LAYOUT_OPS)):
            continue
        counts[name] = counts.get(name, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    parts = [name + (f" x{count}" if count > 1 else "") for name, count in ranked[:limit]]
    return ", ".join(parts) + (f" +{len(ranked) - limit}" if len(ranked) > limit else "")


def _reference_graph(record: Any) -> Any:
    graph_map = record.graph_map or {}
    return graph_map.get(REFERENCE_GRAPH, record.edge_dialect_program)


def instruction_map(
    executorch_manager: Any, reference_graph: str = REFERENCE_GRAPH
) -> dict[str, Any]:
    """For each instruction of the emitted program that computes a value: the nodes of the
    record's reference graph (``REFERENCE_GRAPH``) whose values it writes, in output order.

    A delegate call writes the outputs of the subgraph it was lowered from; their names are
    those of the reference graph, which is the graph that was partitioned. A kernel is matched
    to the reference node with the same origin (``from_node``), operator and type. After
    emission each node's ``debug_handle`` is its instruction's index (ExecuTorch's emitter sets
    it so), which is what ties a node to its instruction."""

    reference = _reference_graph(executorch_manager.get_etrecord())
    by_origin: dict[tuple[str, int], list[torch.fx.Node]] = {}
    for node in reference.graph.nodes:
        origin = _first_origin(node) if node.op == "call_function" else None
        if origin is not None:
            by_origin.setdefault(origin, []).append(node)
    names = {node.name for node in reference.graph.nodes}
    program = executorch_manager.exported_program()
    instructions: dict[str, dict[str, Any]] = {}
    for node in program.graph.nodes:
        index = node.meta.get("debug_handle")
        if node.op != "call_function" or not isinstance(index, int):
            continue
        if node.target is executorch_call_delegate:
            lowered = getattr(program.graph_module, str(node.args[0].target))
            outputs = lowered.original_module.graph.output_node().args[0]
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            instructions[str(index)] = {
                "kind": "delegate",
                "backend": lowered.backend_id,
                "lowered_module": str(node.args[0].target),
                "ops": _ops_summary(lowered.original_module.graph),
                "outputs": [_through_layout_ops(o, names) for o in outputs],
            }
            continue
        if "getitem" in str(node.target) or "alloc" in str(node.target):
            continue  # emit no instruction: their debug handles are the original ones
        origin = _first_origin(node)
        matches = [
            n
            for n in (by_origin.get(origin, []) if origin is not None else [])
            if _op_key(n.target) == _op_key(node.target)
            and _meta_signature(n) == _meta_signature(node)
        ]
        instructions[str(index)] = {
            "kind": "kernel",
            "operator": ".".join(_op_key(node.target)),
            "outputs": [matches[0].name] if len(matches) == 1 else [None],
        }
    return {
        "format": INSTRUCTION_MAP_FORMAT,
        "reference_graph": reference_graph,
        "float_graph": FLOAT_MODEL + "/forward",
        "instructions": dict(sorted(instructions.items(), key=lambda item: int(item[0]))),
    }


def write_etrecord(
    folder: Path,
    executorch_manager: Any,
    representative_inputs: Sequence[torch.Tensor],
    *,
    float_program: Any = None,
    forbidden_paths: Iterable[str | Path] = (),
    full: bool = False,
) -> list[str]:
    """Writes ``etrecord.bin`` and ``etrecord.json`` into ``folder``; ``full``: the record
    with the ATen program and ``float_program`` (``etrecord_bytes``). The record is a debugging
    aid, so a model whose float program ExecuTorch cannot serialize gets a record without it,
    and one whose record cannot be written (or would name a path of this machine) gets none:
    the export goes on, and the returned notes (also logged as warnings) say what is missing."""
    notes: list[str] = []
    data: bytes | None = None
    for with_float in (True, False) if full and float_program is not None else (False,):
        try:
            data = etrecord_bytes(
                executorch_manager,
                representative_inputs,
                float_program=float_program if with_float else None,
                forbidden_paths=forbidden_paths,
                full=full,
            )
            break
        except Exception as error:
            what = "with the float model" if with_float else "at all"
            notes.append(
                f"the ETRecord could not be written {what}: {type(error).__name__}: {error}"
            )
            if with_float:  # the record already holds it: start again from a fresh one
                graph_map = executorch_manager.get_etrecord().graph_map or {}
                graph_map.pop(FLOAT_MODEL + "/forward", None)
    if data is not None:
        (folder / ETRECORD_NAME).write_bytes(data)
        try:
            mapping = instruction_map(executorch_manager, reference_graph_name(data))
        except Exception as error:  # etkit inspect then says the map is missing
            notes.append(f"{INSTRUCTION_MAP_NAME} could not be written: {error}")
        else:
            (folder / INSTRUCTION_MAP_NAME).write_text(json.dumps(mapping, indent=2) + "\n")
    for note in notes:
        logger.warning("%s", note)
    return notes
