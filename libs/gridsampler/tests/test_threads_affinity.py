"""The integer kernel's default thread count follows the CPUs the process may use (its affinity
mask, as taskset and cpusets set it), not the machine's hardware threads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from gridsampler_cases import SNORM8, SNORM16, random_grid, random_image

from etkit_gridsampler import GridSampleOp, cpu

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this platform"
)

# Pins itself to the CPUs in argv[1] (comma-separated), then prints the C API's default thread
# count and the size of its affinity mask. It loads the native library with ctypes alone when
# it can find it (importing the package, which imports executorch, takes seconds).
_PINNED = textwrap.dedent(
    """
    import ctypes, importlib.util, os, pathlib, sys
    os.sched_setaffinity(0, {int(cpu) for cpu in sys.argv[1].split(",")})
    spec = importlib.util.find_spec("etkit_gridsampler")
    folders = (spec.submodule_search_locations or []) if spec else []
    found = [p for folder in folders for p in sorted(pathlib.Path(folder).glob("_native*.so"))]
    if found:
        library = ctypes.CDLL(str(found[0]))
    else:
        from etkit_gridsampler._library import native_library
        library = native_library()
    threads = library.etkit_gridsampler_default_num_threads()
    print(threads, len(os.sched_getaffinity(0)))
    """
)


def _pinned_process(cpus: set[int]) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PINNED, ",".join(str(c) for c in sorted(cpus))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"the pinned process failed ({done.returncode}):\n{done.stderr}"
    threads, allowed = (int(word) for word in done.stdout.split()[-2:])
    return threads, allowed


@contextmanager
def _pinned_thread(cpus: set[int]) -> Iterator[None]:
    """This thread (sched_setaffinity of pid 0 is the calling thread on Linux) on ``cpus``."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@needs_affinity
def test_a_process_pinned_to_one_cpu_defaults_to_one_thread() -> None:
    assert _pinned_process({min(os.sched_getaffinity(0))}) == (1, 1)


@needs_affinity
def test_default_threads_follow_the_affinity_at_the_call() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    generator = torch.Generator().manual_seed(2)
    # large enough that the kernel takes threads by default
    image = random_image((1, 4, 64, 64), generator).contiguous(memory_format=torch.channels_last)
    grid = random_grid((1, 512, 300), torch.int16, generator)
    op = GridSampleOp("bilinear", "border", False, SNORM8, SNORM16, SNORM8)
    expected = cpu.grid_sample(image, grid, op, num_threads=1)
    with _pinned_thread({allowed[0]}):
        assert cpu.default_num_threads() == 1
        assert torch.equal(cpu.grid_sample(image, grid, op), expected)
    if len(allowed) >= 2:
        with _pinned_thread(set(allowed[:2])):
            assert 1 <= cpu.default_num_threads() <= 2  # a cgroup CPU quota may cap it
    assert 1 <= cpu.default_num_threads() <= len(allowed)


def test_num_threads_is_checked() -> None:
    generator = torch.Generator().manual_seed(1)
    image = random_image((1, 4, 8, 8), generator)
    grid = random_grid((1, 4, 4), torch.int16, generator)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
    with pytest.raises(ValueError, match="num_threads must be 0"):
        cpu.grid_sample(image, grid, op, num_threads=-1)
    with pytest.raises(TypeError, match="num_threads must be an int"):
        cpu.grid_sample(image, grid, op, num_threads=2.0)  # type: ignore[arg-type]
    assert torch.equal(
        cpu.grid_sample(image, grid, op, num_threads=1), cpu.grid_sample(image, grid, op)
    )
