"""A run of etkit's Python runner as a Chrome trace (the JSON ``chrome://tracing`` and
https://ui.perfetto.dev open): the method, and inside it each kernel and each delegate call at
the time it ran, with its instruction and, for a delegate, its backend, what ran it and the
value indices it read and wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from etkit_pterunner.engine import RunResult

_PID = 1
_TID = 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(result: RunResult, *, program: str = "model.pte") -> dict[str, Any]:
    """``result`` (from ``PteProgram.run``) as a Chrome trace: ``{"traceEvents": [...]}`` with
    one complete event (``"ph": "X"``, microseconds) per instruction that ran, under one for the
    method."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": _TID,
         "args": {"name": f"etkit runner: {program}"}},
        {"name": "thread_name", "ph": "M", "pid": _PID, "tid": _TID,
         "args": {"name": f"method {result.method}"}},
        {"name": result.method, "cat": "method", "ph": "X", "ts": 0.0,
         "dur": _us(result.seconds), "pid": _PID, "tid": _TID,
         "args": {"kernel_calls": len(result.kernel_calls),
                  "delegate_calls": len(result.delegate_calls)}},
    ]  # fmt: skip
    for kernel in result.kernel_calls:
        events.append(
            {
                "name": kernel.operator,
                "cat": "kernel",
                "ph": "X",
                "ts": _us(kernel.started),
                "dur": _us(kernel.seconds),
                "pid": _PID,
                "tid": _TID,
                "args": {"instruction": kernel.instruction, "chain": kernel.chain},
            }
        )
    for call in result.delegate_calls:
        events.append(
            {
                "name": f"{call.backend_id} (delegate {call.delegate})",
                "cat": "delegate",
                "ph": "X",
                "ts": _us(call.started),
                "dur": _us(call.seconds),
                "pid": _PID,
                "tid": _TID,
                "args": {
                    "instruction": call.instruction,
                    "chain": call.chain,
                    "delegate": call.delegate,
                    "backend": call.backend_id,
                    "implementation": call.implementation,
                    "input_values": list(call.input_indices),
                    "output_values": list(call.output_indices),
                },
            }
        )
    events[3:] = sorted(events[3:], key=lambda event: float(event["ts"]))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: RunResult, path: Path, *, program: str = "model.pte") -> Path:
    """Writes ``chrome_trace(result)`` to ``path``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(result, program=program), indent=1) + "\n")
    return path
