"""Where an export's time goes inside the stages that call upstream code (``lower_main`` above
all): each graph pass, partitioner, backend ``preprocess``, decomposition and external tool
(model-converter) timed by its own (exclusive) seconds, named by its class and said to be
etkit's or upstream's by the module that defines it.

``profiled(profile)`` patches, for as long as it is active, the few entry points every such
piece goes through: ``torch.fx``'s ``PassBase.__call__`` (ExecuTorch's ``ExportPass``, the Arm
and XNNPACK passes, etkit's), ExecuTorch's ``ExportedProgramPassBase.__call__``, each
partitioner's ``partition``, each backend's ``preprocess`` (the classes ExecuTorch's
``to_backend`` looks up: ``BackendDetails.__subclasses__()``),
``ExportedProgram.run_decompositions``, each quantizer's ``annotate`` and
``transform_for_annotation`` (torchao's PT2E calls them) and ``subprocess.run`` (named by the
program run). Every patch is undone on exit, also on an error. A piece called inside another
counts in its own row only, so the rows of a stage add up to at most the stage's time; the rest
is ``unattributed`` (the code of the stage itself between those calls: copies of programs,
ExecuTorch's graph surgery, torchao's prepare and convert).

The profile is the pipeline's (``_Stages``): timings.json's ``profile_s`` holds a stage's rows,
and ``etkit-export --profile`` prints them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from executorch.exir.backend.backend_details import BackendDetails
from executorch.exir.backend.partitioner import Partitioner
from executorch.exir.pass_base import ExportedProgramPassBase
from torch.fx.passes.infra.pass_base import PassBase
from torchao.quantization.pt2e.quantizer import Quantizer

# The stages counted as etkit's whole (their rows are not split further): etkit's code, or
# etkit's choice of work (observe_ranges runs the model for etkit's observers;
# lower_grid_sampler is ExecuTorch's to_backend on etkit's partitioner). The others call
# torch.export, torchao's PT2E, ExecuTorch's lowering and serialization, or run the program;
# their etkit share is the rows of etkit's own passes, partitioners, quantizers and backends.
ETKIT_STAGES: Final = frozenset(
    {
        "normalize",
        "observe_ranges",
        "lower_grid_sampler",
        "rgb_to_rgba",
        "channel_maxima",
        "average_pools",
        "pin_layouts",
        "extract_io_quant_params",
        "check_delegates",
    }
)


def origin(kind: type) -> str:
    """``etkit`` for a class defined in an etkit package, else ``upstream``."""
    return _module_origin(kind.__module__)


def _module_origin(module: str) -> str:
    return "etkit" if module.split(".")[0].startswith("etkit") else "upstream"


def _base_stage(stage: str) -> str:
    """A stage's name without its size (``capture [540x960]`` -> ``capture``)."""
    return stage.split(" [")[0]


@dataclass
class _Row:
    calls: int = 0
    seconds: float = 0.0


@dataclass
class PassProfile:
    """The rows of each stage: (what, name, origin) -> calls and exclusive seconds."""

    rows: dict[str, dict[tuple[str, str, str], _Row]] = field(default_factory=dict)
    stage: str = ""
    _children: list[float] = field(default_factory=list)  # child seconds of each open call
    active: set[int] = field(default_factory=set)  # the objects whose call is being timed

    @contextmanager
    def measure(self, what: str, name: str, where: str) -> Iterator[None]:
        """Times one call; its children's seconds are taken off its own."""
        self._children.append(0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            total = time.perf_counter() - start
            own = total - self._children.pop()
            if self._children:
                self._children[-1] += total
            row = self.rows.setdefault(self.stage, {}).setdefault((what, name, where), _Row())
            row.calls += 1
            row.seconds += own

    def section(self, timings: dict[str, float]) -> dict[str, Any]:
        """timings.json's ``profile_s``: per profiled stage its rows (most seconds first), the
        seconds no row holds, and etkit's share of the stages' time (``ETKIT_STAGES`` whole,
        etkit's rows in the others)."""
        stages: dict[str, Any] = {}
        etkit = sum(v for k, v in timings.items() if _base_stage(k) in ETKIT_STAGES)
        for stage, rows in self.rows.items():
            ranked = sorted(rows.items(), key=lambda item: -item[1].seconds)
            attributed = sum(row.seconds for _, row in ranked)
            if _base_stage(stage) not in ETKIT_STAGES:
                etkit += sum(row.seconds for (_, _, where), row in ranked if where == "etkit")
            stages[stage] = {
                "seconds": timings.get(stage),
                "unattributed": round(max(timings.get(stage, 0.0) - attributed, 0.0), 3),
                "rows": [_row_dict(key, row) for key, row in ranked],
            }
        total = sum(timings.values())
        return {
            "stages": stages,
            "etkit_seconds": round(etkit, 3),
            "total_seconds": round(total, 3),
            "etkit_share": round(etkit / total, 4) if total else None,
        }


def _row_dict(key: tuple[str, str, str], row: _Row) -> dict[str, Any]:
    what, name, where = key
    return {"what": what, "name": name, "origin": where, "calls": row.calls,
            "seconds": round(row.seconds, 3)}  # fmt: skip


def _wrapped(profile: PassProfile, what: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) in profile.active:  # a subclass's override calling its base's: one call
            return method(self, *args, **kwargs)
        kind = type(self)
        profile.active.add(id(self))
        try:
            with profile.measure(what, kind.__name__, origin(kind)):
                return method(self, *args, **kwargs)
        finally:
            profile.active.discard(id(self))

    return call


def _caller_origin() -> str:
    """``etkit`` when the code that called ``subprocess.run`` is etkit's (its shader compiler
    run, say), else ``upstream``."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module != __name__ and not module.startswith("subprocess"):
            return _module_origin(module)
        frame = frame.f_back
    return "upstream"


def _program_name(args: Any) -> str:
    command = args[0] if args else ""
    if isinstance(command, (list, tuple)):
        command = command[0] if command else ""
    return Path(str(command).split()[0]).name if str(command).strip() else "subprocess"


@contextmanager
def profiled(profile: PassProfile) -> Iterator[PassProfile]:
    """``profile`` collecting rows while active (see the module's docstring)."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attribute: str, replacement: Any) -> None:
        saved.append((owner, attribute, owner.__dict__[attribute]))
        setattr(owner, attribute, replacement)

    try:
        for base in (PassBase, ExportedProgramPassBase):  # and overrides (ArmPass.__call__)
            for kind in (base, *_subclasses(base)):
                if "__call__" in kind.__dict__:
                    patch(kind, "__call__", _wrapped(profile, "pass", kind.__dict__["__call__"]))
        for base, what, methods in _ENTRY_POINTS:  # wrappers call their inner ones directly
            for kind in _subclasses(base):
                for method in methods:
                    if method in kind.__dict__:
                        patch(kind, method, _wrapped(profile, what, kind.__dict__[method]))
        decompose = torch.export.ExportedProgram.run_decompositions

        def run_decompositions(self: Any, *args: Any, **kwargs: Any) -> Any:
            with profile.measure("decompositions", "run_decompositions", "upstream"):
                return decompose(self, *args, **kwargs)

        patch(torch.export.ExportedProgram, "run_decompositions", run_decompositions)
        for backend in BackendDetails.__subclasses__():
            if "preprocess" in backend.__dict__:
                patch(backend, "preprocess", _preprocess(profile, backend))
        run = subprocess.run

        def timed_run(*args: Any, **kwargs: Any) -> Any:
            name = _program_name(args or (kwargs.get("args"),))
            with profile.measure("tool", name, _caller_origin()):
                return run(*args, **kwargs)

        patch(subprocess, "run", timed_run)
        yield profile
    finally:
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)


# Methods each subclass defines for itself, timed per class
_ENTRY_POINTS: Final = (
    (Partitioner, "partitioner", ("partition",)),
    (Quantizer, "quantizer", ("annotate", "transform_for_annotation")),
)


def _subclasses(kind: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in kind.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return list(dict.fromkeys(found))


def _preprocess(profile: PassProfile, backend: type) -> Any:
    """``backend``'s ``preprocess`` (ExecuTorch calls it on the class), timed."""
    original = backend.__dict__["preprocess"]
    function = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    bound = isinstance(original, classmethod)

    def preprocess(*args: Any, **kwargs: Any) -> Any:
        with profile.measure("preprocess", backend.__name__, origin(backend)):
            return function(backend, *args, **kwargs) if bound else function(*args, **kwargs)

    return staticmethod(preprocess)


def profile_text(section: dict[str, Any], limit: int = 12) -> list[str]:
    """``etkit-export --profile``'s lines: etkit's share, then each profiled stage's rows."""
    lines = [
        f"profile: etkit's own code {section['etkit_seconds']:.1f} s of "
        f"{section['total_seconds']:.1f} s ({100 * (section['etkit_share'] or 0):.1f} %)"
    ]
    for stage, entry in section["stages"].items():
        rows = entry["rows"]
        lines.append(
            f"  {stage}: {entry['seconds'] or 0:.2f} s, {len(rows)} kinds of call, "
            f"{entry['unattributed']:.2f} s between them"
        )
        for row in rows[:limit]:
            lines.append(
                f"    {row['seconds']:8.3f} s  {row['calls']:4d}x  {row['what']:<14} "
                f"{row['name']} ({row['origin']})"
            )
        if len(rows) > limit:
            rest = sum(r["seconds"] for r in rows[limit:])
            lines.append(f"    {rest:8.3f} s  {len(rows) - limit} more kinds")
    return lines
