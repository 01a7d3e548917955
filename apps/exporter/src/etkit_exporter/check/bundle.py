"""Bundled programs (``model.bpte``): the written program with test vectors a device runner
checks it with.

ExecuTorch's Arm compiler bundles float example inputs with the float model's outputs; an etkit
program's IO is integer, so that bundle cannot even run. Here the inputs are the example inputs
in the program's own IO types and layouts (quantized with ``io_quant_params.json``), and the
expected outputs are what the written program itself returned on them in the verified run (not
the quantized PT2E model's outputs, which the program may differ from by a rounding step). The
tolerance, in output steps, is recorded beside it in ``model.bpte.json``: 0, for the integer
paths are exact (TOSA's integer semantics, etkit's grid sampler bit-identical on CPU and
Vulkan), so any difference on a device is a finding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from executorch.devtools.bundled_program.core import BundledProgram
from executorch.devtools.bundled_program.schema import bundled_program_schema as schema
from executorch.devtools.bundled_program.serialize import (
    _bundled_program_schema_to_flatbuffer,
    deserialize_from_flatbuffer_to_bundled_program,
)
from executorch.exir.schema import ScalarType

from etkit_exporter.check.metrics import within_tolerance
from etkit_exporter.core.backend_ids import VGF_BACKEND
from etkit_exporter.programs import GridSamplerImpl, program_from_bytes
from etkit_exporter.programs.runtime import runtime_method
from etkit_pterunner import PteFormatError

BUNDLE_NAME: Final = "model.bpte"
SIDECAR_NAME: Final = "model.bpte.json"


class BundleError(ValueError):
    """A file that is not a readable bundled program."""


@dataclass(frozen=True)
class OutputCheck:
    """One output of one bundled test case against its expected value."""

    case: int
    output: int
    max_steps: float
    differing: int
    total: int
    tolerance_steps: float
    over: int = 0  # values more than tolerance_steps off
    max_fraction: float = 0.0
    method: str = "forward"

    @property
    def passes(self) -> bool:
        """The bundle's rule (``etkit_exporter.check.metrics.within_tolerance``): at most
        ``max_fraction`` of the values more than ``tolerance_steps`` off."""

        return within_tolerance(self.over, self.total, self.max_fraction)


@dataclass(frozen=True)
class BundleCase:
    """One test case to bundle: the method it calls, its inputs and the expected outputs (each
    in the program's own dtype and dim order)."""

    method: str
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]


def bundle_bytes(pte: Path, cases: Sequence[BundleCase]) -> bytes:
    """The ``.bpte`` of the program in ``pte`` with ``cases``: one test suite per method (in
    the order the cases first name them), its cases in the order given."""
    if not cases:
        raise ValueError("a bundle needs at least one test case")
    suites: dict[str, list[BundleCase]] = {}
    for case in cases:
        suites.setdefault(case.method, []).append(case)
    in_schema = BundledProgram(
        None,
        [
            MethodTestSuite(
                method_name=method,
                test_cases=[
                    MethodTestCase(inputs=list(c.inputs), expected_outputs=list(c.expected))
                    for c in method_cases
                ],
            )
            for method, method_cases in suites.items()
        ],
        pte_file_path=str(pte),
    ).serialize_to_schema()
    # ExecuTorch stores every tensor contiguous (dim order 0, 1, 2, 3) whatever its layout; a
    # runtime copies bundled bytes into the program's input as they are, so a channels-last
    # input would get NCHW bytes. Store each channels-last tensor in its own dim order.
    for suite, method_cases in zip(in_schema.method_test_suites, suites.values(), strict=True):
        for bundled_case, case in zip(suite.test_cases, method_cases, strict=True):
            for values, tensors in (
                (bundled_case.inputs, case.inputs),
                (bundled_case.expected_outputs, case.expected),
            ):
                for value, tensor in zip(values, tensors, strict=True):
                    if isinstance(value.val, schema.Tensor) and _is_channels_last(tensor):
                        value.val.data = _bytes(tensor.permute(0, 2, 3, 1).contiguous())
                        value.val.dim_order = [0, 2, 3, 1]
    return bytes(_bundled_program_schema_to_flatbuffer(in_schema))


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def _is_channels_last(tensor: torch.Tensor) -> bool:
    return (
        tensor.dim() == 4
        and not tensor.is_contiguous()
        and tensor.is_contiguous(memory_format=torch.channels_last)
    )


def sidecar(
    io_params: dict[str, Any],
    runner: str,
    tolerance_steps: float = 0,
    max_fraction: float = 0.0,
    verdict: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``model.bpte.json`` says: where the expected outputs came from and the tolerance per
    output, in steps of its scale (and as an absolute tolerance on the integers a device
    runner compares), by the verdict's rule: at most ``max_fraction`` of the values more than
    ``tolerance_steps`` off. ``verdict``: the verified run's verdict against the quantized
    PT2E model (report.json's), recorded beside."""
    outputs = []
    for index, entry in enumerate(io_params["outputs"]):
        scale = entry.get("scale")
        outputs.append(
            {
                "output": index,
                "dtype": entry.get("dtype"),
                "scale": scale,
                "tolerance_steps": tolerance_steps,
                "max_fraction": max_fraction,
                "atol": tolerance_steps if scale is not None else 0.0,
            }
        )
    side: dict[str, Any] = {
        "expected_outputs": f"the written program's own outputs in its verified run ({runner})",
        "inputs": "the example inputs in the program's IO types (io_quant_params.json)",
        "outputs": outputs,
    }
    if verdict is not None:
        side["verdict_against_the_quantized_model"] = {
            "result": verdict.get("result"),
            "tolerance": verdict.get("tolerance"),
        }
    return side


@dataclass(frozen=True)
class Bundle:
    """A bundled program as read back: the program bytes and, per method, its test cases as
    (inputs, expected outputs) tensors."""

    program: bytes
    cases: dict[str, list[tuple[list[Any], list[torch.Tensor]]]]


def read_bundle(path: Path) -> Bundle:
    """Reads a ``.bpte`` (``BundleError`` naming the file when it is not one)."""

    try:
        data = path.read_bytes()
    except OSError as error:
        raise BundleError(f"{path} cannot be read: {error.strerror or error}") from None
    if len(data) < 8 or data[4:8] != b"BP08":
        raise BundleError(
            f"{path} is not a bundled program (no BP08 identifier at byte 4): give a .bpte "
            "written by etkit-export --bundle or ExecuTorch's BundledProgram"
        )
    try:
        schema = deserialize_from_flatbuffer_to_bundled_program(data)
    except Exception as error:
        raise BundleError(f"{path} is a damaged bundled program ({type(error).__name__})") from None
    cases: dict[str, list[tuple[list[Any], list[torch.Tensor]]]] = {}
    for suite in schema.method_test_suites:
        cases[suite.method_name] = [
            (
                [_value(v) for v in case.inputs],
                [
                    t
                    for t in (_value(v) for v in case.expected_outputs)
                    if isinstance(t, torch.Tensor)
                ],
            )
            for case in suite.test_cases
        ]
    return Bundle(bytes(schema.program), cases)


def _value(value: Any) -> Any:
    val = value.val
    if isinstance(val, schema.Tensor):
        dtype = _DTYPES.get(ScalarType(val.scalar_type))
        if dtype is None:
            raise BundleError(f"a bundled tensor has scalar type {val.scalar_type}, not supported")
        sizes = [int(s) for s in val.sizes]
        order = [int(d) for d in val.dim_order] or list(range(len(sizes)))
        physical = [sizes[d] for d in order]
        flat = torch.frombuffer(bytearray(val.data), dtype=dtype) if val.data else torch.empty(0)
        if flat.numel() != math.prod(sizes):
            raise BundleError(
                f"a bundled tensor holds {flat.numel()} values for sizes {sizes}: damaged"
            )
        tensor = flat.reshape(physical)
        inverse = [order.index(d) for d in range(len(order))]
        return tensor.permute(inverse)
    for name in ("int_val", "bool_val", "double_val"):
        if hasattr(val, name):
            return getattr(val, name)
    raise BundleError(f"a bundled value of type {type(val).__name__} is not supported")


_DTYPES: dict[Any, torch.dtype] = {}


def _init_dtypes() -> None:
    _DTYPES.update(
        {
            ScalarType.BYTE: torch.uint8,
            ScalarType.CHAR: torch.int8,
            ScalarType.SHORT: torch.int16,
            ScalarType.INT: torch.int32,
            ScalarType.LONG: torch.int64,
            ScalarType.HALF: torch.float16,
            ScalarType.FLOAT: torch.float32,
            ScalarType.DOUBLE: torch.float64,
            ScalarType.BOOL: torch.bool,
        }
    )


def compare(
    actual: list[torch.Tensor],
    expected: list[torch.Tensor],
    sidecar_data: dict[str, Any] | None,
    case: int = 0,
    method: str = "forward",
) -> list[OutputCheck]:
    """Each output against its expected value: steps apart (integer outputs: the integers;
    float outputs: in units of the sidecar's scale, or absolute), with the sidecar's tolerance
    (0 without one)."""
    if len(actual) != len(expected):
        raise BundleError(
            f"the program returned {len(actual)} outputs, the bundle expects {len(expected)}"
        )
    sides = {o["output"]: o for o in (sidecar_data or {}).get("outputs", [])}
    checks = []
    for index, (y, e) in enumerate(zip(actual, expected, strict=True)):
        if tuple(y.shape) != tuple(e.shape) or y.dtype != e.dtype:
            raise BundleError(
                f"output {index}: the program returned {y.dtype} {list(y.shape)}, the bundle "
                f"expects {e.dtype} {list(e.shape)}"
            )
        difference = (y.double() - e.double()).abs()
        side = sides.get(index, {})
        limit = float(side.get("tolerance_steps", 0.0))
        checks.append(
            OutputCheck(
                case=case,
                output=index,
                max_steps=float(difference.max()) if difference.numel() else 0.0,
                differing=int((difference > 0).sum()),
                total=difference.numel(),
                tolerance_steps=limit,
                over=int((difference > limit).sum()),
                max_fraction=float(side.get("max_fraction", 0.0)),
                method=method,
            )
        )
    return checks


def run_bundle(
    path: Path, grid_sampler_impl: GridSamplerImpl = "cpu"
) -> tuple[str, list[OutputCheck]]:
    """Runs every bundled test case of ``path`` on the program it holds and compares the
    outputs with the expected ones (tolerances from ``model.bpte.json`` beside it, 0 without
    one). A program with VGF delegates runs in etkit's runner (VGF on Vulkan through
    ``scenario_runner``, the grid sampler on ``grid_sampler_impl``); any other in
    ``executorch.runtime`` with etkit's grid-sampler backend registered. Returns what ran it
    and one check per output per case."""

    bundle = read_bundle(path)
    side = path.with_name(path.name + ".json")
    sidecar_data = json.loads(side.read_text()) if side.is_file() else None
    try:
        program = program_from_bytes(
            bundle.program,
            source="its program",
            grid_sampler_impl=grid_sampler_impl,
        )
    except PteFormatError as error:
        raise BundleError(f"{path} is a damaged bundled program ({error})") from None
    use_runner = any(d.backend_id == VGF_BACKEND for d in program.delegates)
    checks: list[OutputCheck] = []
    number = 0
    for method, cases in bundle.cases.items():
        for inputs, expected in cases:
            if use_runner:
                actual = list(program.run(inputs, method).outputs)
            else:
                actual = _run_in_executorch_runtime(bundle.program, method, inputs)
            checks.extend(compare(actual, expected, sidecar_data, number, method))
            number += 1
    if not number:
        raise BundleError(f"{path} holds no test case")
    runner = (
        f"etkit runner (VGF on scenario_runner, grid sampler {grid_sampler_impl})"
        if use_runner
        else "executorch.runtime"
    )
    return runner, checks


def _run_in_executorch_runtime(
    program: bytes, method: str, inputs: list[Any]
) -> list[torch.Tensor]:
    loaded = runtime_method(program, method)
    if loaded is None:
        raise BundleError(f"the bundled program has no method {method!r}")
    return [y for y in loaded.execute(inputs) if isinstance(y, torch.Tensor)]


_init_dtypes()
