"""The NEON kernel (AArch64 Advanced SIMD) against the scalar kernel: built for AArch64 by Debian's
cross compiler with a small driver (native/quantized_driver.cpp) and run under qemu-user, its
output compared bit for bit with this machine's scalar kernel (``cpu.grid_sample(...,
isa="scalar")``) over the exhaustive cases of test_vectorized.py: every grid value in every mode,
padding and align_corners setting, every channel count and layout, the requantization forms,
float output, edge image sizes, taps outside the image, runs across batch elements. The driver's
counters show that the NEON kernel computed every pixel it claims (and no pixel of a
configuration it leaves to the scalar kernel), and it places every image right before an
unreadable page: a read past an image's end crashes it.

The cross compiler and qemu-user are required (scripts/setup.sh installs them): without them these
tests fail, they do not skip."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import neon_qemu
import pytest
import torch
from gridsampler_cases import (
    CHANNELS,
    COMBINATIONS,
    GRID_Q,
    IMAGE_Q,
    ONE_OF_EACH,
    OUTPUT_Q,
    SNORM8,
    SNORM16,
    every_grid_value,
    near_image_grid,
    random_image,
    row_length_cases,
)
from neon_qemu import Case, Result

from etkit_gridsampler import GridSampleOp, QParams, cpu


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver, built once per session (about 5 s of CPU time)."""
    try:
        return neon_qemu.build_driver(tmp_path_factory.mktemp("neon"))
    except neon_qemu.ToolchainMissingError as error:
        pytest.fail(str(error), pytrace=False)


@dataclass
class Expected:
    case: Case
    output: torch.Tensor
    label: str
    neon: bool  # the NEON kernel computes every pixel (else none)


class Batch:
    """Cases collected with their expected output (this machine's scalar kernel), then run in
    two driver processes at once and checked."""

    def __init__(self) -> None:
        self.items: list[Expected] = []

    def add(
        self,
        image: torch.Tensor,
        grid: torch.Tensor,
        op: GridSampleOp,
        label: str = "",
        *,
        isa: str = "neon",
        rows_per_call: int = 0,
        neon: bool = True,
        output_layout: torch.memory_format | None = None,
    ) -> None:
        expected = cpu.grid_sample(image, grid, op, isa="scalar")
        if output_layout is not None:  # the same values in another layout
            expected = expected.contiguous(memory_format=output_layout)
        case = Case(image, grid, op, expected.stride(), isa, rows_per_call)
        description = f"{op}, image {tuple(image.shape)} strides {image.stride()}, grid "
        description += f"{tuple(grid.shape)} strides {grid.stride()}, {isa}, rows {rows_per_call}"
        self.items.append(Expected(case, expected, f"{label}: {description}", neon))

    def run(self, driver: Path) -> dict[str, int]:
        """Runs and checks every case; returns the NEON counters summed over them."""
        half = (len(self.items) + 1) // 2
        parts = [self.items[:half], self.items[half:]]
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda part: run_part(driver, part), parts))
        totals = dict.fromkeys(neon_qemu.COUNTERS, 0)
        for part, results in zip(parts, replies, strict=True):
            for item, result in zip(part, results, strict=True):
                check(item, result)
                for name, value in result.counters.items():
                    totals[name] += value
        return totals


def run_part(driver: Path, items: Sequence[Expected]) -> list[Result]:
    return neon_qemu.run(driver, [item.case for item in items]) if items else []


def check(item: Expected, result: Result) -> None:
    expected, actual = item.output, result.output
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    if expected.dtype == torch.float32:  # bits, not values
        expected, actual = expected.view(torch.int32), actual.view(torch.int32)
    differ = expected != actual
    if differ.any():
        first = tuple(int(i) for i in differ.nonzero()[0])
        raise AssertionError(
            f"{int(differ.sum())} outputs differ from the scalar kernel's, the first at "
            f"{first}: {actual[first].item()} != {expected[first].item()}; {item.label}"
        )
    pixels = expected.shape[0] * expected.shape[2] * expected.shape[3]
    neon = pixels if item.neon else 0
    assert result.counters["pixels"] == neon, f"NEON computed {result.counters}: {item.label}"
    forms = sum(result.counters[name] for name in ("integer", "nearest", "exact", "table"))
    assert forms == neon, f"coordinate forms {result.counters}: {item.label}"


def layouts(image: torch.Tensor) -> Iterator[torch.Tensor]:
    """The image in both memory formats."""
    yield image.contiguous()
    yield image.contiguous(memory_format=torch.channels_last)


def test_driver_scalar_kernel_gives_this_machines_bits(driver: Path) -> None:
    """The driver's scalar kernel (isa scalar, compiled for AArch64) computes this machine's
    scalar bits and runs no NEON; so the comparisons below compare NEON with the contract."""
    generator = torch.Generator().manual_seed(1)
    batch = Batch()
    for (mode, padding, align_corners), channels in itertools.product(COMBINATIONS, (1, 4)):
        image = random_image((1, channels, 9, 13), generator)
        grid = near_image_grid((1, 5, 23), 0.8, generator, torch.int16)
        for image_q, grid_q, output_q in ONE_OF_EACH[:3]:
            grid_i = grid if grid_q.dtype == torch.int16 else grid.to(torch.int8)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            for im in layouts(image):
                batch.add(im, grid_i, op, "scalar", isa="scalar", neon=False)
    batch.run(driver)


# The image sizes sampled (each costs the same: one output per grid value); 9 x 13 runs on
# demand in the monorepo's run (pytest -m extended).
EVERY_VALUE_SIZES = [(2, 2), (37, 61), pytest.param((9, 13), marks=pytest.mark.extended)]


@pytest.mark.parametrize("size", EVERY_VALUE_SIZES)
@pytest.mark.parametrize(("mode", "padding", "align_corners"), COMBINATIONS)
def test_same_bits_as_scalar_over_every_grid_value(
    driver: Path, mode: str, padding: str, align_corners: bool, size: tuple[int, int]
) -> None:
    """Steps 1 to 3 in each of their forms (integer, nearest integer, exact 64-bit, int8 tables)
    over every grid value of each grid quantization, with each image quantization and output
    form (int8 at ratio 1 and 3, float32), at image sizes from 2 x 2, on a planar one-channel
    image and a 4-channel channels-last one."""
    batch = Batch()
    for (height, width), channels_last in itertools.product((size,), (0, 1)):
        generator = torch.Generator().manual_seed(height * 100 + width)
        image = random_image((1, 4 if channels_last else 1, height, width), generator)
        if channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        for image_q, grid_q, output_q in itertools.product(IMAGE_Q, GRID_Q, OUTPUT_Q[::2]):
            grid = every_grid_value(grid_q.dtype, 1)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            batch.add(image, grid, op, "every grid value")
    counters = batch.run(driver)
    # int8 grids read tables; int16 grids take the integer forms where they apply, else the
    # exact one (always for reflection)
    assert counters["table"] == 12 * 256
    if padding == "reflection":
        assert counters["exact"] == 48 * 65536
    else:
        assert counters["integer" if mode == "bilinear" else "nearest"] >= 24 * 65536


# Image scale / output scale 257/256: multiplier 257 * 2^22, shift 45, reduced to 257 and 23 (too
# large for the 32-bit lanes), where halves occur: a value of 128 steps is 128.5 output steps.
TIE_IMAGE_Q = QParams(257 / 32768, -1, -128, 127, torch.int8)
TIE_OUTPUT_Q = QParams(1 / 128, -2, -128, 127, torch.int8)


def test_same_bits_as_scalar_in_every_requantization_form(driver: Path) -> None:
    """Step 5 in each form (multiplier 1, a small multiplier in 32-bit lanes, the 64-bit form,
    the nearest table, float32) for each image quantization, over every grid value; and the
    64-bit form's halves to even, on an image of 127 (v = 128) whose values are all halves."""
    generator = torch.Generator().manual_seed(2)
    batch = Batch()
    image = random_image((1, 4, 9, 13), generator)
    grid = every_grid_value(torch.int16, 1)
    for (mode, padding), image_q, output_q in itertools.product(
        (("bilinear", "border"), ("nearest", "zeros")), IMAGE_Q, OUTPUT_Q
    ):
        op = GridSampleOp(mode, padding, False, image_q, SNORM16, output_q)  # type: ignore[arg-type]
        for im in layouts(image):
            batch.add(im, grid, op, "requantization")
    halves = torch.full((1, 4, 9, 13), 127, dtype=torch.int8)
    for mode, im in itertools.product(("bilinear", "nearest"), (*layouts(halves), image)):
        op = GridSampleOp(mode, "border", False, TIE_IMAGE_Q, SNORM16, TIE_OUTPUT_Q)  # type: ignore[arg-type]
        batch.add(im, grid, op, "halves")
    batch.run(driver)
    # the halves round to even: 128.5 - 2 -> 126
    op = GridSampleOp("bilinear", "border", False, TIE_IMAGE_Q, SNORM16, TIE_OUTPUT_Q)
    assert (cpu.grid_sample(halves, grid, op, isa="scalar") == 126).all()


CHANNEL_COUNTS = sorted({*CHANNELS, 6, 7, 12, 24, 48})  # 5, 6, 7, 12, 24: taps one by one


@pytest.mark.parametrize("channels", CHANNEL_COUNTS)
def test_every_channel_count_and_layout_same_bits_as_scalar(driver: Path, channels: int) -> None:
    """Steps 4 and 5 of each channel count in both layouts, both modes, every padding: images
    from 2 x 2 up, outputs whose rows end anywhere in a group of sixteen, grids that are not
    (x, y) pairs, taps outside the image and each quantization form."""
    generator = torch.Generator().manual_seed(channels)
    sizes = [(2, 2), (3, 5), (7, 2), (11, 23)]
    batch = Batch()
    for index, (mode, padding, align_corners) in enumerate(COMBINATIONS):
        height, width = sizes[index % len(sizes)]
        image = random_image((2, channels, height, width), generator)
        for image_q, grid_q, output_q in ONE_OF_EACH:
            grid = near_image_grid((2, 5, 37), 0.7, generator, grid_q.dtype)
            strided = grid.transpose(1, 2).contiguous().transpose(1, 2)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            for im, g in itertools.product(layouts(image), (grid, strided)):
                batch.add(im, g, op, "channels")
    counters = batch.run(driver)
    assert counters["edge"] > 0  # bilinear taps outside the image were staged one by one


def test_other_layouts_same_bits_as_scalar(driver: Path) -> None:
    """Layouts the C++ API takes and cpu.grid_sample does not make: an output in the other
    memory format than its image's, and images sliced in x (taps two or more bytes apart): the
    kernel reads their taps one by one and stores their outputs one by one."""
    generator = torch.Generator().manual_seed(8)
    batch = Batch()
    for channels, (mode, padding, align_corners) in itertools.product((1, 3, 4, 8), COMBINATIONS):
        image = random_image((2, channels, 9, 14), generator)
        grid = near_image_grid((2, 5, 19), 0.8, generator, torch.int16)
        for image_q, grid_q, output_q in ONE_OF_EACH[:4]:
            g = grid if grid_q.dtype == torch.int16 else grid.to(torch.int8)
            op = GridSampleOp(mode, padding, align_corners, image_q, grid_q, output_q)  # type: ignore[arg-type]
            for im, other in zip(
                layouts(image), (torch.channels_last, torch.contiguous_format), strict=True
            ):
                batch.add(im, g, op, "other output layout", output_layout=other)
                batch.add(im[:, :, 1:, ::2], g, op, "sliced image")
    batch.run(driver)


def test_edge_image_sizes_same_bits_as_scalar(driver: Path) -> None:
    """Images of one row, one column or one pixel (the scalar x86 fallbacks; NEON stages their
    taps one by one) and just past a group of sixteen, every mode and padding."""
    generator = torch.Generator().manual_seed(4)
    batch = Batch()
    for (height, width), channels in itertools.product(
        ((1, 1), (1, 2), (2, 1), (1, 17), (17, 1), (2, 17)), (1, 3, 4, 8, 16, 5)
    ):
        image = random_image((1, channels, height, width), generator)
        grid = near_image_grid((1, 3, 19), 1.2, generator, torch.int16)
        for mode, padding, align_corners in COMBINATIONS:
            op = GridSampleOp(mode, padding, align_corners, SNORM8, SNORM16, OUTPUT_Q[3])  # type: ignore[arg-type]
            for im in layouts(image):
                batch.add(im, grid, op, "edge sizes")
    batch.run(driver)


def test_row_lengths_and_strided_grids_same_bits_as_scalar(driver: Path) -> None:
    """Output rows of every length around the 8- and 16-pixel steps and the 256-pixel blocks, a
    near-identity grid (most taps inside, the right and bottom edges outside), a grid that is
    not contiguous, and kernel calls of a few rows (as threads make them)."""
    generator = torch.Generator().manual_seed(3)
    batch = Batch()
    for out_width, image, grid, strided in row_length_cases(generator):
        for padding, output_q in itertools.product(["zeros", "border"], OUTPUT_Q):
            op = GridSampleOp("bilinear", padding, False, SNORM8, SNORM16, output_q)  # type: ignore[arg-type]
            for g, rows in ((grid, 0), (strided, 0), (grid, 3)):
                batch.add(image, g, op, f"width {out_width}", rows_per_call=rows)
    batch.run(driver)


@pytest.mark.parametrize("align_corners", [False, True])
def test_same_bits_as_scalar_on_wide_images(driver: Path, align_corners: bool) -> None:
    """A 4096-pixel row with a grid reaching 32 widths out (scale 1/1024), and an odd 24-bit scale
    across it: step 1's products pass 2^31 (the exact form), every grid value."""
    generator = torch.Generator().manual_seed(11)
    image = random_image((1, 4, 3, 4096), generator).contiguous(memory_format=torch.channels_last)
    grid = every_grid_value(torch.int16, 1)
    grid_qs = [QParams(1 / 1024, 0, -32768, 32767, torch.int16), GRID_Q[2]]
    batch = Batch()
    for grid_q, (mode, padding), output_q in itertools.product(
        grid_qs, (("bilinear", "zeros"), ("bilinear", "border"), ("nearest", "reflection")),
        OUTPUT_Q[::2],
    ):  # fmt: skip
        op = GridSampleOp(mode, padding, align_corners, SNORM8, grid_q, output_q)  # type: ignore[arg-type]
        batch.add(image, grid, op, "wide")
    batch.run(driver)


def test_reflection_quotients_off_by_one(driver: Path) -> None:
    """Reflection folds a coordinate by the float64 quotient of its distance by the period K,
    corrected when one off. For K = 98 (width 49 without align_corners, height 50 with it),
    98 * 2^e times the float64 of 1/98 lies below 2^e: the quotient of those distances comes out
    one below and the correction must fix it. A grid reaching 32 sizes out (scale 1/1024), every
    value, passes distances 98 and 196 on each axis."""
    generator = torch.Generator().manual_seed(12)
    image = random_image((1, 3, 50, 49), generator)
    grid = every_grid_value(torch.int16, 1)
    grid_q = QParams(1 / 1024, 0, -32768, 32767, torch.int16)
    batch = Batch()
    for mode, align_corners, im in itertools.product(
        ("bilinear", "nearest"), (False, True), layouts(image)
    ):
        op = GridSampleOp(mode, "reflection", align_corners, SNORM8, grid_q, SNORM8)  # type: ignore[arg-type]
        batch.add(im, grid, op, "period 98")
    assert batch.run(driver)["exact"] == 8 * 65536


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_runs_across_batch_elements_same_bits_as_scalar(driver: Path, mode: str) -> None:
    """A correlation lookup: many small images, 9 x 9 samples of each around a point, which the
    kernel runs many batch elements at a time; also in calls of a few rows, as threads make
    them (a call then starts and ends inside an element)."""
    generator = torch.Generator().manual_seed(5)
    batch = Batch()
    for channels, (height, width) in itertools.product((1, 2, 4), ((2, 3), (5, 7), (23, 31))):
        image = random_image((67, channels, height, width), generator)
        centre = torch.rand((67, 1, 1, 2), generator=generator) * 2 - 1
        steps = torch.linspace(-4, 4, 9)
        dy, dx = torch.meshgrid(steps, steps, indexing="ij")
        offsets = torch.stack((dx * 2 / width, dy * 2 / height), -1)
        grid = torch.clamp(torch.round((centre + offsets) * 32767), -32768, 32767).to(torch.int16)
        for padding, im, rows in itertools.product(("zeros", "border"), layouts(image), (0, 7)):
            op = GridSampleOp(mode, padding, True, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
            batch.add(im, grid, op, "lookup", rows_per_call=rows)
    batch.run(driver)


def test_reads_nothing_outside_the_image(driver: Path) -> None:
    """Every image the driver receives ends right before an unreadable page (and small ones start
    right after one): images sampled at and past every edge, in every mode, layout and channel
    count, in one block and in runs across batch elements; and a read past the end of such an
    image does crash the driver under qemu."""
    generator = torch.Generator().manual_seed(9)
    batch = Batch()
    for channels, (height, width), padding in itertools.product(
        (1, 2, 3, 4, 5, 8, 16), ((1, 2), (2, 2), (3, 5), (4, 1)), ("zeros", "border")
    ):
        image = random_image((3, channels, height, width), generator)
        grid = near_image_grid((3, 4, 21), 1.2, generator, torch.int16)
        for mode, im in itertools.product(("bilinear", "nearest"), layouts(image)):
            op = GridSampleOp(mode, padding, False, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
            batch.add(im, grid, op, "guard")
    batch.run(driver)
    image = random_image((1, 1, 3, 5), generator)
    with pytest.raises(neon_qemu.DriverError, match="status -11"):
        neon_qemu.probe(driver, image, past_end=1)
    assert neon_qemu.probe(driver, image, past_end=0) == int(image.flatten()[-1])


def test_configurations_outside_run_the_scalar_kernel(driver: Path) -> None:
    """Sides of 2^15 pixels or more run the scalar kernel (the counters say no NEON ran), with
    the same bits; isa scalar runs it everywhere."""
    generator = torch.Generator().manual_seed(6)
    batch = Batch()
    image = random_image((1, 4, 2, 1 << 15), generator)
    grid = near_image_grid((1, 2, 40), 0.9, generator, torch.int16)
    for (mode, padding, align_corners), im in itertools.product(COMBINATIONS[::3], layouts(image)):
        op = GridSampleOp(mode, padding, align_corners, SNORM8, SNORM16, SNORM8)  # type: ignore[arg-type]
        batch.add(im, grid, op, "2^15 wide", neon=False)
    small = random_image((1, 4, 5, 6), generator)
    for isa in ("scalar", "auto"):
        op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
        batch.add(small, grid, op, "isa", isa=isa, neon=isa == "auto")
    batch.run(driver)


def test_the_library_builds_for_aarch64(
    driver: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every source CMakeLists.txt lists compiles for AArch64 (the x86 kernels to stubs), they
    link into one shared object that defines every etkit symbol it uses, the NEON kernel among
    them, and the integer kernel's dispatch (quantized.cpp, which the ExecuTorch backend and
    the C API call) calls it."""
    library, objects = neon_qemu.build_library(tmp_path_factory.mktemp("library"))
    assert {"quantized", "quantized_neon", "quantized_x86", "backend"} <= set(objects)
    assert not [name for name in neon_qemu.symbols(library, True) if "etkit" in name]
    neon = "etkit::gridsampler::grid_sample_quantized_neon<"
    assert any(neon in name for name in neon_qemu.symbols(library, False))
    assert any(neon in name for name in neon_qemu.symbols(objects["quantized"], True))
    assert not any("avx" in name for name in neon_qemu.symbols(objects["quantized"], True))


def test_neon_is_refused_on_this_cpu_unless_it_has_it() -> None:
    """Off AArch64, "neon" is not offered and asking for it says so."""
    import platform

    if platform.machine().lower() in ("aarch64", "arm64"):
        assert cpu.available_isas() == ("scalar", "neon")
        return
    assert "neon" not in cpu.available_isas()
    image = random_image((1, 4, 2, 2), torch.Generator().manual_seed(0))
    grid = torch.zeros(1, 1, 1, 2, dtype=torch.int16)
    op = GridSampleOp("bilinear", "zeros", False, SNORM8, SNORM16, SNORM8)
    with pytest.raises(ValueError, match="got 'neon' \\(not available on this CPU: AArch64"):
        cpu.grid_sample(image, grid, op, isa="neon")
