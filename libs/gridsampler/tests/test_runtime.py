"""A .pte whose delegate names the grid-sampler backend runs in executorch.runtime, takes its image
and grid from the arguments its blob names, and refuses a blob or arguments that do not fit."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

from etkit_gridsampler import GridSampleOp, GridSamplerPartitioner, QParams, cpu, runtime
from etkit_gridsampler.delegate_format import BLOB_SIZE, CRC_OFFSET, MAGIC, ArgumentRoles, decode


class Resample(torch.nn.Module):
    def __init__(self, mode: str, padding: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = flow * 0.5  # computed in the graph (exactly), left to the portable kernels
        return F.grid_sample(
            image, grid, mode=self.mode, padding_mode=self.padding, align_corners=self.align_corners
        )


def _lower(model: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> Path:
    exported = torch.export.export(model, example, strict=True)
    partitioner = GridSamplerPartitioner()
    program = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    delegates = [n for n in program.exported_program().graph.nodes if n.op == "get_attr"]
    assert len(delegates) == 1 and not partitioner.rejections
    path.write_bytes(program.to_executorch().buffer)
    return path


def test_register_is_idempotent() -> None:
    assert runtime.register() == runtime.BACKEND_ID
    assert runtime.register() == runtime.BACKEND_ID
    assert runtime.is_registered()


@pytest.mark.parametrize(
    ("mode", "padding", "align_corners"),
    [("bilinear", "zeros", False), ("nearest", "reflection", True), ("bilinear", "border", True)],
)
def test_pte_runs_and_matches_cpu_kernel(
    tmp_path: Path, mode: str, padding: str, align_corners: bool
) -> None:
    torch.manual_seed(0)
    image, flow = torch.randn(2, 4, 6, 10), torch.randn(2, 5, 7, 2)
    model = Resample(mode, padding, align_corners).eval()
    pte = _lower(model, (image, flow), tmp_path / "resample.pte")
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    (output,) = method.execute([image, flow])
    op = GridSampleOp(mode=mode, padding_mode=padding, align_corners=align_corners)  # type: ignore[arg-type]
    assert torch.equal(output, cpu.grid_sample(image, flow * 0.5, op))
    torch.testing.assert_close(output, model(image, flow), atol=1e-5, rtol=0)


def _resample_pte(tmp_path: Path, image: torch.Tensor, flow: torch.Tensor) -> Path:
    model = Resample("bilinear", "border", False).eval()
    return _lower(model, (image, flow), tmp_path / "resample.pte")


def test_channels_last_tensors_are_honoured(tmp_path: Path) -> None:
    torch.manual_seed(1)
    image = torch.randn(1, 4, 6, 10).contiguous(memory_format=torch.channels_last)
    flow = torch.randn(1, 5, 7, 2)
    pte = _resample_pte(tmp_path, image, flow)
    runtime.register()
    (output,) = Runtime.get().load_program(pte).load_method("forward").execute([image, flow])
    op = GridSampleOp(mode="bilinear", padding_mode="border", align_corners=False)
    expected = cpu.grid_sample(image, flow * 0.5, op)
    assert torch.equal(output.contiguous(), expected.contiguous())


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [(4, 9, "newer"), (20, None, "checksum"), (0, 0x58, "magic")],
    ids=["newer-version", "corrupt", "bad-magic"],
)
def test_bad_blob_in_a_pte_is_refused_at_load(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], offset: int, value: int | None, message: str
) -> None:
    torch.manual_seed(2)
    image, flow = torch.randn(1, 2, 4, 4), torch.randn(1, 3, 3, 2)
    data = bytearray(_resample_pte(tmp_path, image, flow).read_bytes())
    start = data.find(b"ETGS")
    assert start >= 0
    data[start + offset] = (data[start + offset] ^ 0xFF) if value is None else value
    broken = tmp_path / "broken.pte"
    broken.write_bytes(bytes(data))
    runtime.register()
    program = Runtime.get().load_program(broken)
    with pytest.raises(RuntimeError):
        program.load_method("forward")
    assert message in capfd.readouterr().err  # the backend says why


IMAGE_Q = QParams(1 / 127, 0, -127, 127, torch.int8)
GRID_Q = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
OUTPUT_Q = QParams(1 / 100, 3, -128, 127, torch.int8)
QUANTIZED_OP = GridSampleOp(
    mode="bilinear",
    padding_mode="border",
    align_corners=False,
    image=IMAGE_Q,
    grid=GRID_Q,
    output=OUTPUT_Q,
)


def _dq(q: torch.Tensor, p: QParams) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(
        q, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
    )
    return result


class QuantizedGridFirst(torch.nn.Module):
    """Integers in and out, the grid's dequantize before the image's: the partition's first
    input, and so the delegate's first runtime argument, is the grid."""

    def forward(self, grid_q: torch.Tensor, image_q: torch.Tensor) -> torch.Tensor:
        grid = _dq(grid_q, GRID_Q)
        image = _dq(image_q, IMAGE_Q)
        out = F.grid_sample(image, grid, padding_mode="border", align_corners=False)
        p = OUTPUT_Q
        result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(
            out, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
        )
        return result


class GridFirst(torch.nn.Module):
    """The grid is the first model input."""

    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, padding_mode="zeros", align_corners=True)


class OneTensor(torch.nn.Module):
    """One N x A x B x 2 tensor is both the image (C = A, H = B, W = 2) and the grid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(x, x, padding_mode="border", align_corners=False)


def _blob_of(pte: bytes) -> bytes:
    start = pte.find(MAGIC)
    assert start >= 0 and pte.find(MAGIC, start + 1) < 0
    return pte[start : start + BLOB_SIZE]


def _patched(pte: bytes, offset: int, fmt: str, *values: int) -> bytes:
    """``pte`` with its delegate blob's field at ``offset`` set and the checksum recomputed."""
    data = bytearray(pte)
    start = pte.find(MAGIC)
    struct.pack_into(fmt, data, start + offset, *values)
    body = bytes(data[start : start + CRC_OFFSET])
    struct.pack_into("<I", data, start + CRC_OFFSET, zlib.crc32(body))
    return bytes(data)


def _quantized_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    grid_q = torch.randint(-36000, 36000, (1, 5, 7, 2)).clamp(-32767, 32767).to(torch.int16)
    image_q = torch.randint(-127, 128, (1, 3, 6, 9), dtype=torch.int8)
    return grid_q, image_q


@pytest.fixture(scope="module")
def quantized_pte(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """QuantizedGridFirst lowered once for the tests that run it or mangle its blob."""
    path = tmp_path_factory.mktemp("quantized") / "grid_first.pte"
    return _lower(QuantizedGridFirst(), _quantized_inputs(3), path).read_bytes()


def test_grid_first_quantized_program_runs(quantized_pte: bytes) -> None:
    grid_q, image_q = _quantized_inputs(3)
    assert decode(_blob_of(quantized_pte)).roles == ArgumentRoles(inputs=2, image=1, grid=0)
    runtime.register()
    (output,) = (
        Runtime.get().load_program(quantized_pte).load_method("forward").execute([grid_q, image_q])
    )
    assert torch.equal(output, cpu.grid_sample(image_q, grid_q, QUANTIZED_OP))


def test_grid_first_float_program_runs(tmp_path: Path) -> None:
    torch.manual_seed(4)
    grid, image = torch.rand(1, 5, 7, 2) * 2.2 - 1.1, torch.randn(1, 3, 6, 9)
    pte = _lower(GridFirst().eval(), (grid, image), tmp_path / "grid_first.pte")
    runtime.register()
    (output,) = Runtime.get().load_program(pte).load_method("forward").execute([grid, image])
    op = GridSampleOp(mode="bilinear", padding_mode="zeros", align_corners=True)
    assert torch.equal(output, cpu.grid_sample(image, grid, op))


def test_one_tensor_as_image_and_grid_runs(tmp_path: Path) -> None:
    torch.manual_seed(5)
    x = torch.rand(2, 5, 6, 2) * 2 - 1
    pte = _lower(OneTensor().eval(), (x,), tmp_path / "one_tensor.pte").read_bytes()
    assert decode(_blob_of(pte)).roles == ArgumentRoles(inputs=1, image=0, grid=0)
    runtime.register()
    (output,) = Runtime.get().load_program(pte).load_method("forward").execute([x])
    op = GridSampleOp(mode="bilinear", padding_mode="border", align_corners=False)
    assert torch.equal(output, cpu.grid_sample(x, x, op))
    torch.testing.assert_close(output, OneTensor()(x), atol=1e-5, rtol=0)


def test_swapped_roles_are_refused_at_execute(
    quantized_pte: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    grid_q, image_q = _quantized_inputs(6)
    swapped = _patched(quantized_pte, 13, "<BB", 0, 1)  # image 0, grid 1: what version 1 assumed
    runtime.register()
    method = Runtime.get().load_program(swapped).load_method("forward")  # a valid blob
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        method.execute([grid_q, image_q])
    err = capfd.readouterr().err
    assert "image (argument 0): expected int8 [1, 3, 6, 9], got int16 [1, 5, 7, 2]" in err
    assert "grid (argument 1): expected int16 [1, 5, 7, 2], got int8 [1, 3, 6, 9]" in err


def test_reshaped_blob_is_refused_at_execute(
    quantized_pte: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    grid_q, image_q = _quantized_inputs(7)
    reshaped = _patched(quantized_pte, 88, "<4i", 1, 3, 6, 8)  # the image's W, 9, written as 8
    runtime.register()
    method = Runtime.get().load_program(reshaped).load_method("forward")
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        method.execute([grid_q, image_q])
    err = capfd.readouterr().err
    assert "image (argument 1): expected int8 [1, 3, 6, 8], got int8 [1, 3, 6, 9]" in err
    assert "grid (argument 0): expected int16 [1, 5, 7, 2], got int16 [1, 5, 7, 2]" in err


@pytest.mark.parametrize(
    ("offset", "fmt", "values", "message"),
    [
        (13, "<B", (2,), "image argument index 2, must be below the input count 2"),
        (14, "<B", (7,), "grid argument index 7, must be below the input count 2"),
        (13, "<BB", (1, 1), "image and grid argument indices are both 1"),
        (12, "<B", (3,), "input count 3"),
    ],
    ids=["image-out-of-range", "grid-out-of-range", "same-index", "input-count"],
)
def test_bad_roles_are_refused_at_load(
    quantized_pte: bytes,
    capfd: pytest.CaptureFixture[str],
    offset: int,
    fmt: str,
    values: tuple[int, ...],
    message: str,
) -> None:
    runtime.register()
    program = Runtime.get().load_program(_patched(quantized_pte, offset, fmt, *values))
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        program.load_method("forward")
    assert message in capfd.readouterr().err
