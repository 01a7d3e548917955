"""Every public kernel entry checks its operands before any kernel touches them
and names what is wrong and what would be right: device, layout, dtype, rank, shape agreement and
storage, for cpu.grid_sample, vulkan.grid_sample, reference.grid_sample, vulkan.dispatch and the
plan. Cases that crashed the process before these checks (meta tensors, storage that does not
hold the elements, fake tensors) run in a subprocess, so a segfault fails them instead of
killing pytest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gridsampler_cases import SNORM8, SNORM16

from etkit_gridsampler import GridSampleOp, cpu, plan, reference, vulkan
from etkit_gridsampler.plan import UnsupportedOpError

Q_OP = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
F_OP = GridSampleOp("bilinear", "border", True)


def q_image(*shape: int) -> torch.Tensor:
    return torch.zeros(shape or (1, 4, 8, 8), dtype=torch.int8)


def q_grid(*shape: int) -> torch.Tensor:
    return torch.zeros(shape or (1, 3, 5, 2), dtype=torch.int16)


def f_image(*shape: int) -> torch.Tensor:
    return torch.zeros(shape or (1, 4, 8, 8))


def f_grid(*shape: int) -> torch.Tensor:
    return torch.zeros(shape or (1, 3, 5, 2))


def shrunk(tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``tensor`` with its storage resized below what its shape reaches (as FSDP frees it)."""
    tensor.untyped_storage().resize_(nbytes)
    return tensor


def fake(tensor: torch.Tensor) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode().from_tensor(tensor)


def nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.zeros(4, 8, 8), torch.zeros(4, 6, 8)])


@dataclass(frozen=True)
class Case:
    call: Callable[[], object]
    error: type[Exception]
    match: str


# Each runs in a subprocess: before the checks, some crashed the interpreter (SIGSEGV).
CRASH_PRONE: dict[str, Case] = {
    "cpu float, meta image": Case(
        lambda: cpu.grid_sample(f_image().to("meta"), f_grid(), F_OP),
        ValueError,
        r"image must be a CPU tensor, got one on meta \(a meta tensor has no data",
    ),
    "cpu float, meta grid": Case(
        lambda: cpu.grid_sample(f_image(), f_grid().to("meta"), F_OP),
        ValueError,
        r"grid must be a CPU tensor, got one on meta",
    ),
    "cpu int8, meta image and grid": Case(
        lambda: cpu.grid_sample(q_image().to("meta"), q_grid().to("meta"), Q_OP),
        ValueError,
        r"image must be a CPU tensor, got one on meta",
    ),
    "cpu int8, meta grid": Case(
        lambda: cpu.grid_sample(q_image(), q_grid().to("meta"), Q_OP),
        ValueError,
        r"grid must be a CPU tensor, got one on meta.*grid\.cpu\(\)",
    ),
    "vulkan, meta image": Case(
        lambda: vulkan.grid_sample(q_image().to("meta"), q_grid(), Q_OP),
        ValueError,
        r"image must be a CPU tensor, got one on meta",
    ),
    "reference, meta grid": Case(
        lambda: reference.grid_sample(q_image(), q_grid().to("meta"), Q_OP),
        ValueError,
        r"grid must be a CPU tensor, got one on meta",
    ),
    "cpu float, image storage freed": Case(
        lambda: cpu.grid_sample(shrunk(f_image(), 0), f_grid(), F_OP),
        ValueError,
        r"image's storage holds 0 bytes, but its shape \(1, 4, 8, 8\).* reach 1024 bytes",
    ),
    "cpu int8, grid storage shrunk": Case(
        lambda: cpu.grid_sample(q_image(), shrunk(q_grid(), 8), Q_OP),
        ValueError,
        r"grid's storage holds 8 bytes, but its shape \(1, 3, 5, 2\)",
    ),
    "vulkan, image storage shrunk": Case(
        lambda: vulkan.grid_sample(shrunk(q_image(), 100), q_grid(), Q_OP),
        ValueError,
        r"image's storage holds 100 bytes",
    ),
    "cpu float, fake image": Case(
        lambda: cpu.grid_sample(fake(f_image()), f_grid(), F_OP),
        ValueError,
        r"image is a FakeTensor .* has no data",
    ),
    "cpu int8, fake grid": Case(
        lambda: cpu.grid_sample(q_image(), fake(q_grid()), Q_OP),
        ValueError,
        r"grid is a FakeTensor",
    ),
}

_MAX = 2**31 - 1

CASES: dict[str, Case] = {
    # not a tensor, not an op
    "cpu, numpy image": Case(
        lambda: cpu.grid_sample(np.zeros((1, 4, 8, 8), np.float32), f_grid(), F_OP),  # type: ignore[arg-type]
        TypeError,
        r"image must be a torch\.Tensor \(N x C x H x W\), got numpy\.ndarray; convert it "
        r"with torch\.from_numpy\(image\)",
    ),
    "cpu, list grid": Case(
        lambda: cpu.grid_sample(f_image(), [[0.0, 0.0]], F_OP),  # type: ignore[arg-type]
        TypeError,
        r"grid must be a torch\.Tensor \(N x Ho x Wo x 2\), got builtins\.list",
    ),
    "cpu, op a string": Case(
        lambda: cpu.grid_sample(f_image(), f_grid(), "bilinear"),  # type: ignore[arg-type]
        TypeError,
        r"op must be an etkit_gridsampler\.GridSampleOp, got builtins\.str",
    ),
    "vulkan, numpy grid": Case(
        lambda: vulkan.grid_sample(q_image(), np.zeros((1, 3, 5, 2), np.int16), Q_OP),  # type: ignore[arg-type]
        TypeError,
        r"grid must be a torch\.Tensor",
    ),
    "vulkan, op None": Case(
        lambda: vulkan.grid_sample(q_image(), q_grid(), None),  # type: ignore[arg-type]
        TypeError,
        r"op must be an etkit_gridsampler\.GridSampleOp, got builtins\.NoneType",
    ),
    "reference, numpy image": Case(
        lambda: reference.grid_sample(np.zeros((1, 4, 8, 8)), f_grid(), F_OP),  # type: ignore[arg-type]
        TypeError,
        r"image must be a torch\.Tensor",
    ),
    # layout
    "cpu, sparse image": Case(
        lambda: cpu.grid_sample(f_image().to_sparse(), f_grid(), F_OP),
        ValueError,
        r"image must be a dense \(torch\.strided\) tensor, got layout torch\.sparse_coo; "
        r"convert it with image\.to_dense\(\)",
    ),
    "cpu, sparse grid": Case(
        lambda: cpu.grid_sample(q_image(), q_grid().to_sparse(), Q_OP),
        ValueError,
        r"grid must be a dense \(torch\.strided\) tensor, got layout torch\.sparse_coo",
    ),
    "cpu, mkldnn image": Case(
        lambda: cpu.grid_sample(f_image().to_mkldnn(), f_grid(), F_OP),
        ValueError,
        r"image must be a dense \(torch\.strided\) tensor, got layout torch\._mkldnn",
    ),
    "cpu, nested image": Case(
        lambda: cpu.grid_sample(nested(), f_grid(2, 3, 5, 2), F_OP),
        ValueError,
        r"image must be a dense N x C x H x W tensor, got a nested tensor",
    ),
    "vulkan, sparse image": Case(
        lambda: vulkan.grid_sample(q_image().to_sparse(), q_grid(), Q_OP),
        ValueError,
        r"image must be a dense \(torch\.strided\) tensor",
    ),
    # dtype
    "cpu float op, float64 image": Case(
        lambda: cpu.grid_sample(f_image().double(), f_grid(), F_OP),
        ValueError,
        r"image must be torch\.float32 for a float GridSampleOp .*got torch\.float64; convert "
        r"it with image\.float\(\)",
    ),
    "cpu float op, int16 grid": Case(
        lambda: cpu.grid_sample(f_image(), q_grid(), F_OP),
        ValueError,
        r"grid must be torch\.float32 for a float GridSampleOp .*got torch\.int16",
    ),
    "cpu int8 op, float image": Case(
        lambda: cpu.grid_sample(f_image(), q_grid(), Q_OP),
        ValueError,
        r"image must be torch\.int8: op quantizes the image to torch\.int8; got torch\.float32",
    ),
    "cpu int8 op, uint8 image": Case(
        lambda: cpu.grid_sample(q_image().to(torch.uint8), q_grid(), Q_OP),
        ValueError,
        r"image must be torch\.int8: .*got torch\.uint8",
    ),
    "cpu int8 op, int8 grid for int16": Case(
        lambda: cpu.grid_sample(q_image(), q_grid().to(torch.int8), Q_OP),
        ValueError,
        r"grid must be torch\.int16: op quantizes the grid to torch\.int16; got torch\.int8",
    ),
    "vulkan, float32 grid": Case(
        lambda: vulkan.grid_sample(q_image(), f_grid(), Q_OP),
        ValueError,
        r"grid must be torch\.int16",
    ),
    "reference, float grid for a quantized op": Case(
        lambda: reference.grid_sample(q_image(), f_grid(), Q_OP),
        ValueError,
        r"grid must be torch\.int16, the dtype of op\.grid, got torch\.float32",
    ),
    "cpu, op quantizing the image only": Case(
        lambda: cpu.grid_sample(q_image(), f_grid(), GridSampleOp(image=SNORM8)),
        UnsupportedOpError,
        r"int16 or int8 grid",
    ),
    # rank and shape agreement
    "cpu, 3-D image": Case(
        lambda: cpu.grid_sample(f_image(4, 8, 8), f_grid(), F_OP),
        ValueError,
        r"image must be N x C x H x W \(4-D\), got shape \(4, 8, 8\)",
    ),
    "cpu, 5-D grid": Case(
        lambda: cpu.grid_sample(q_image(), q_grid(1, 1, 3, 5, 2), Q_OP),
        ValueError,
        r"grid must be N x Ho x Wo x 2 \(4-D, \(x, y\) last\), got shape \(1, 1, 3, 5, 2\)",
    ),
    "cpu, grid last size 3": Case(
        lambda: cpu.grid_sample(f_image(), f_grid(1, 3, 5, 3), F_OP),
        ValueError,
        r"grid must be N x Ho x Wo x 2 .*got shape \(1, 3, 5, 3\)",
    ),
    "cpu, batch 1 image, batch 2 grid": Case(
        lambda: cpu.grid_sample(q_image(), q_grid(2, 3, 5, 2), Q_OP),
        ValueError,
        r"image and grid must have the same batch size N, got image N = 1 .* grid N = 2",
    ),
    "vulkan, batch 2 image, batch 1 grid": Case(
        lambda: vulkan.grid_sample(q_image(2, 4, 8, 8), q_grid(), Q_OP),
        ValueError,
        r"same batch size N, got image N = 2 .* grid N = 1",
    ),
    "reference, grid last size 1": Case(
        lambda: reference.grid_sample(f_image(), f_grid(1, 3, 5, 1), F_OP),
        ValueError,
        r"grid must be N x Ho x Wo x 2",
    ),
    # zero sizes
    "cpu, no channels": Case(
        lambda: cpu.grid_sample(f_image(1, 0, 8, 8), f_grid(), F_OP),
        ValueError,
        r"image must have every size at least 1 \(N x C x H x W\), got shape \(1, 0, 8, 8\)",
    ),
    "cpu, empty batch": Case(
        lambda: cpu.grid_sample(q_image(0, 4, 8, 8), q_grid(0, 3, 5, 2), Q_OP),
        ValueError,
        r"image must have every size at least 1",
    ),
    "cpu, empty grid": Case(
        lambda: cpu.grid_sample(q_image(), q_grid(1, 0, 5, 2), Q_OP),
        ValueError,
        r"grid must have every size at least 1 \(N x Ho x Wo x 2\), got shape \(1, 0, 5, 2\)",
    ),
    "vulkan, zero-width image": Case(
        lambda: vulkan.grid_sample(q_image(1, 4, 8, 0), q_grid(), Q_OP),
        ValueError,
        r"image must have every size at least 1",
    ),
    # the other arguments
    "cpu, unknown isa": Case(
        lambda: cpu.grid_sample(q_image(), q_grid(), Q_OP, isa="sse9"),  # type: ignore[arg-type]
        ValueError,
        r"isa must be 'auto' or one of .* got 'sse9'",
    ),
    "cpu, num_threads a string": Case(
        lambda: cpu.grid_sample(q_image(), q_grid(), Q_OP, num_threads="4"),  # type: ignore[arg-type]
        TypeError,
        r"num_threads must be an int",
    ),
    "plan, zero height": Case(
        lambda: plan.plan(Q_OP, 0, 8),
        UnsupportedOpError,
        r"image height and width must be at least 1, got 0 x 8",
    ),
    "plan, float width": Case(
        lambda: plan.unsupported_reason(Q_OP, 8, 8.0),  # type: ignore[arg-type]
        TypeError,
        r"width must be an int",
    ),
    "plan, op a dict": Case(
        lambda: plan.plan({"mode": "bilinear"}, 8, 8),  # type: ignore[arg-type]
        TypeError,
        r"op must be an etkit_gridsampler\.GridSampleOp, got dict",
    ),
    # the Vulkan kernel's shapes: named limits, not struct.error
    "dispatch, batch 1 image, batch 2 grid": Case(
        lambda: vulkan.dispatch((1, 4, 8, 8), (2, 3, 5, 2), Q_OP),
        ValueError,
        r"image_shape and grid_shape must have the same batch size N, got image N = 1 "
        r"\(\(1, 4, 8, 8\)\) and grid N = 2 \(\(2, 3, 5, 2\)\)",
    ),
    "dispatch, image past 2^31 elements": Case(
        lambda: vulkan.dispatch((1, 128, 4096, 4096), (1, 4, 4, 2), Q_OP),
        ValueError,
        r"the image \(1, 128, 4096, 4096\) has N x C x H x W = 2147483648 elements, more than "
        r"the Vulkan kernel's limit of 2\^31 - 1 = 2147483647",
    ),
    "dispatch, grid past 2^31 elements": Case(
        lambda: vulkan.dispatch((1, 1, 8, 8), (1, 32768, 32768, 2), Q_OP),
        ValueError,
        r"the grid \(1, 32768, 32768, 2\) has N x Ho x Wo x 2 = 2147483648 elements",
    ),
    "dispatch, output past 2^31 elements": Case(
        lambda: vulkan.dispatch((2, 64, 8, 8), (2, 4096, 4096, 2), Q_OP),
        ValueError,
        r"the output has N x C x Ho x Wo = 2147483648 elements, more than the Vulkan kernel's "
        r"limit",
    ),
    "dispatch, far past 2^31 (int64 sizes)": Case(
        lambda: vulkan.dispatch((3, 2**20, 2**20, 2**20), (3, 1, 1, 2), Q_OP),
        ValueError,
        r"the image .* elements, more than the Vulkan kernel's limit",
    ),
    "dispatch, three sizes": Case(
        lambda: vulkan.dispatch((1, 4, 8), (1, 3, 5, 2), Q_OP),  # type: ignore[arg-type]
        TypeError,
        r"image_shape must be a sequence of 4 ints \(N x C x H x W\), got \(1, 4, 8\)",
    ),
    "dispatch, float size": Case(
        lambda: vulkan.dispatch((1, 4, 8, 8), (1, 3, 5.0, 2), Q_OP),  # type: ignore[arg-type]
        TypeError,
        r"grid_shape must be a sequence of 4 ints",
    ),
    "dispatch, zero size": Case(
        lambda: vulkan.dispatch((1, 4, 8, 8), (1, 0, 5, 2), Q_OP),
        ValueError,
        r"grid_shape must have every size at least 1 \(N x Ho x Wo x 2\), got \(1, 0, 5, 2\)",
    ),
    "dispatch, grid last size 3": Case(
        lambda: vulkan.dispatch((1, 4, 8, 8), (1, 3, 5, 3), Q_OP),
        ValueError,
        r"grid_shape must be N x Ho x Wo x 2 \(\(x, y\) last\), got \(1, 3, 5, 3\)",
    ),
    "dispatch, op not an op": Case(
        lambda: vulkan.dispatch((1, 4, 8, 8), (1, 3, 5, 2), 3),  # type: ignore[arg-type]
        TypeError,
        r"op must be an etkit_gridsampler\.GridSampleOp, got builtins\.int",
    ),
}


def _outcome(case: Case) -> dict[str, str]:
    try:
        case.call()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": "", "message": "returned without raising"}


def _check(name: str, case: Case, outcome: dict[str, Any]) -> None:
    assert outcome["type"] == case.error.__name__, f"{name}: {outcome}"
    assert re.search(case.match, outcome["message"]), (
        f"{name}: {outcome['message']!r} does not match {case.match!r}"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_refused_with_a_message_that_names_the_argument(name: str) -> None:
    case = CASES[name]
    if name.startswith("vulkan") and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    with pytest.raises(case.error, match=case.match):
        case.call()


def _report_crash_prone(out: Any) -> None:
    """Each crash-prone case's outcome as one JSON line on ``out``, flushed before the next case
    runs, so that a crash names its case."""
    for name, case in CRASH_PRONE.items():
        print(json.dumps({"case": name, "started": True}), file=out, flush=True)
        print(json.dumps({"case": name, **_outcome(case)}), file=out, flush=True)


def _run_forked(timeout: float) -> tuple[str, str]:
    """The report of a forked child (which has the modules already imported: a new interpreter
    takes seconds to import executorch), and how the child ended."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        status = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as out:
                _report_crash_prone(out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        text = report.read()  # until the child exits (or dies) and the pipe closes
    deadline = time.monotonic() + timeout
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            ended = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    code = ended[1]
    if os.WIFSIGNALED(code):
        return text, f"killed by {signal.Signals(os.WTERMSIG(code)).name}"
    return text, f"exit status {os.WEXITSTATUS(code)}"


def _run_subprocess(timeout: float) -> tuple[str, str]:
    here = Path(__file__).resolve().parent
    script = (
        f"import sys; sys.path[:0] = [{str(here)!r}]; "
        "import test_inputs_validation as t; t._report_crash_prone(sys.stdout)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    return done.stdout, f"exit status {done.returncode}; stderr:\n{done.stderr[-3000:]}"


@cache
def _crash_prone_outcomes() -> tuple[dict[str, dict[str, Any]], str]:
    """The outcomes of the crash-prone cases, run apart from pytest's process."""
    text, status = _run_forked(300) if hasattr(os, "fork") else _run_subprocess(600)
    outcomes: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            outcomes.setdefault(record["case"], {}).update(record)
    return outcomes, status


@pytest.mark.parametrize("name", list(CRASH_PRONE))
def test_crash_prone_inputs_are_refused_without_a_crash(name: str) -> None:
    case = CRASH_PRONE[name]
    if name.startswith("vulkan") and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    outcomes, status = _crash_prone_outcomes()
    outcome = outcomes.get(name, {})
    assert "type" in outcome, (
        f"the subprocess died {'in' if outcome else 'before'} case {name!r}: {status}"
    )
    _check(name, case, outcome)


def test_unsupported_reason_answers_for_sizes_below_one() -> None:
    assert plan.unsupported_reason(Q_OP, 0, 8) == (
        "image height and width must be at least 1, got 0 x 8"
    )


def test_an_axis_whose_step_1_product_would_overflow_is_refused() -> None:
    """A 16,000,000-pixel axis with grid scale 1e-5 and zero point -32768: coordinates stay
    below 2^24, but (d - zero point) * multiplier passes 2^63 for the extreme grid values, where
    the kernels' int64 step 1 wrapped around (they agreed with each other, not with the
    reference). Refused; an axis of 2^22 pixels at that scale and zero point 0 is not."""
    from etkit_gridsampler import QParams

    grid = QParams(1e-5, -32768, -32768, 32767, torch.int16)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, grid, SNORM8)
    reason = plan.unsupported_reason(op, 1, 16_000_000)
    assert reason is not None and "64-bit product would overflow" in reason
    fine = GridSampleOp("bilinear", "zeros", False, SNORM8, QParams(1e-5, 0, -32767, 32767,
                        torch.int16), SNORM8)  # fmt: skip
    assert plan.unsupported_reason(fine, 1, 2**22) is None


def test_dispatch_up_to_the_limit_packs_its_parameters() -> None:
    """Just under 2^31 elements the dispatch is described and its parameter block packs (it
    raised struct.error past the limit before)."""
    description = vulkan.dispatch((1, 127, 4096, 4096), (1, 4096, 4096, 2), Q_OP)
    assert description.params["total_elements"] == 127 * 4096 * 4096 < _MAX
    assert len(description.params_bytes()) == 200
    description = vulkan.dispatch((1, 4, 8, 8), [1, np.int64(3), 5, 2], Q_OP)
    assert description.params["out_height"] == 3


def test_checks_pass_good_operands_unchanged() -> None:
    """The checks accept what the kernels take: views, expanded grids, negated views."""
    generator = torch.Generator().manual_seed(3)
    image = torch.randn(2, 3, 6, 7, generator=generator)
    grid = torch.rand(1, 4, 5, 2, generator=generator).expand(2, -1, -1, -1) * 2 - 1
    cropped = torch.randn(2, 3, 9, 9, generator=generator)[:, :, 1:7, 2:9]
    for candidate in (image, cropped, image.contiguous(memory_format=torch.channels_last)):
        expected = torch.nn.functional.grid_sample(candidate, grid, align_corners=True)
        torch.testing.assert_close(
            cpu.grid_sample(candidate, grid, GridSampleOp(align_corners=True)), expected
        )
    negated = torch._neg_view(image)
    torch.testing.assert_close(
        cpu.grid_sample(negated, grid, F_OP),
        torch.nn.functional.grid_sample(-image, grid, padding_mode="border", align_corners=True),
    )
