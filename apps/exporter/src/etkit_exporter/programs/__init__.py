"""The .pte programs of this app: etkit_pterunner's interpreter with the app's delegates
registered (etkit's grid sampler, ``GridSamplerDelegate``; VGFs through ``scenario_runner``,
``VgfDelegate``), and the one place where the grid sampler's implementation is chosen.

```python
from etkit_exporter.programs import load_program

program = load_program("artifacts/flow-warp/model.pte", grid_sampler_impl="cpu")
result = program.run([frame0_q, frame1_q], keep_values=True)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND, VGF_BACKEND
from etkit_exporter.programs.grid_sampler import (
    GRID_SAMPLER_IMPLS,
    GridSamplerDelegate,
    GridSamplerImpl,
)
from etkit_exporter.vgf.delegate import VgfDelegate
from etkit_pterunner import Backend, DelegateFn, PteProgram

__all__ = [
    "GRID_SAMPLER_IMPLS",
    "GridSamplerImpl",
    "built_in_backends",
    "load_program",
    "program_from_bytes",
]


def built_in_backends(grid_sampler_impl: GridSamplerImpl = "cpu") -> dict[str, Backend]:
    """The app's delegates by backend id: etkit's grid sampler on ``grid_sampler_impl``'s
    kernel, and VGFs through ``scenario_runner``."""
    return {
        GRID_SAMPLER_BACKEND: GridSamplerDelegate(grid_sampler_impl),
        VGF_BACKEND: VgfDelegate(),
    }


def _with_built_ins(
    program: PteProgram,
    grid_sampler_impl: GridSamplerImpl,
    delegates: Mapping[str, DelegateFn] | None,
) -> PteProgram:
    # GridSamplerDelegate checks grid_sampler_impl (a ValueError naming it) before anything is
    # registered: the one place the implementation is checked and chosen.
    for backend_id, backend in built_in_backends(grid_sampler_impl).items():
        program.register_backend(backend_id, backend)
    for backend_id, fn in (delegates or {}).items():
        program.register_delegate(backend_id, fn)
    return program


def load_program(
    path: str | Path,
    *,
    grid_sampler_impl: GridSamplerImpl = "cpu",
    delegates: Mapping[str, DelegateFn] | None = None,
) -> PteProgram:
    """``path`` read by etkit_pterunner, the app's delegates registered (the grid sampler on
    ``grid_sampler_impl``'s kernel, ``"cpu"`` or ``"vulkan"``), then ``delegates`` (Python
    functions by backend id, replacing them; see ``PteProgram.register_delegate``)."""
    return _with_built_ins(PteProgram.load(path), grid_sampler_impl, delegates)


def program_from_bytes(
    data: bytes,
    *,
    source: str = "<bytes>",
    grid_sampler_impl: GridSamplerImpl = "cpu",
    delegates: Mapping[str, DelegateFn] | None = None,
) -> PteProgram:
    """``load_program`` for the bytes of a ``.pte`` file."""
    program = PteProgram.from_bytes(data, source=source)
    return _with_built_ins(program, grid_sampler_impl, delegates)
