"""Argument roles end to end: PT2E-quantized models whose grid-sampler delegate receives the grid
before the image (the grid a model input listed first; computed from the image by convolutions
before the image it samples; the image produced after the grid), lowered with XNNPACK beside the
grid-sampler backend, run in executorch.runtime and match the converted model within one int8
step. Before the blob recorded the roles, the runtime read the first argument as the image:
XNNPACK programs like these failed at execute with error 0x12."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_gridsampler import GridSampleOp, GridSamplerPartitioner, QParams, cpu, runtime
from etkit_gridsampler.delegate_format import ArgumentRoles, decode
from etkit_quant import BoundaryQuantizer, quantize, snorm8, snorm16


def _pixel_grid(height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


class GridInputFirst(torch.nn.Module):
    """``forward(grid, image)``: the grid is the first model input."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(4, 4, 1)
        self.post = torch.nn.Conv2d(4, 4, 1)

    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        sampled = F.grid_sample(self.pre(image), grid, align_corners=False)
        result: torch.Tensor = self.post(sampled)
        return result


class GridFromConvs(torch.nn.Module):
    """Convolutions of the image predict the flow (an XNNPACK partition); the grid is the pixel
    grid plus that flow; the features it warps are computed after it."""

    def __init__(self) -> None:
        super().__init__()
        self.flow1 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.flow2 = torch.nn.Conv2d(8, 2, 3, padding=1)
        self.features = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        flow = self.flow2(torch.relu(self.flow1(image))).permute(0, 2, 3, 1) * 0.1
        grid = _pixel_grid(image.shape[2], image.shape[3]) + flow
        features = self.features(image)
        return F.grid_sample(features, grid, padding_mode="border", align_corners=False)


class ImageAfterGrid(torch.nn.Module):
    """The image input is listed first, but the grid is computed first (from the second input)
    and the sampled image after it."""

    def __init__(self) -> None:
        super().__init__()
        self.grid = torch.nn.Conv2d(2, 2, 1)
        self.image = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = torch.tanh(self.grid(flow)).permute(0, 2, 3, 1)
        features = self.image(image)
        return F.grid_sample(
            features, grid, mode="bilinear", padding_mode="reflection", align_corners=True
        )


def _grid_sampler_blobs(program: torch.export.ExportedProgram) -> list[bytes]:
    blobs = []
    for node in program.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("lowered_module"):
            module = getattr(program.graph_module, str(node.target))
            if module.backend_id == "GridSamplerBackend":
                blobs.append(bytes(module.processed_bytes))
    return blobs


def _backends(program: torch.export.ExportedProgram) -> set[str]:
    return {
        getattr(program.graph_module, str(n.target)).backend_id
        for n in program.graph.nodes
        if n.op == "get_attr" and str(n.target).startswith("lowered_module")
    }


Case = tuple[torch.nn.Module, tuple[torch.Tensor, ...], tuple[QuantizationSpec, ...]]


def _grid_input_first() -> Case:
    inputs = (torch.rand(1, 5, 7, 2) * 2 - 1, torch.rand(1, 4, 8, 8) * 2 - 1)
    return GridInputFirst(), inputs, (snorm16(), snorm8())


def _grid_from_convs() -> Case:
    return GridFromConvs(), (torch.rand(1, 4, 8, 8) * 2 - 1,), (snorm8(),)


def _image_after_grid() -> Case:
    inputs = (torch.rand(1, 4, 8, 8) * 2 - 1, torch.rand(1, 2, 6, 5) * 2 - 1)
    return ImageAfterGrid(), inputs, (snorm8(), snorm8())


@pytest.mark.parametrize(
    "case",
    [_grid_input_first, _grid_from_convs, _image_after_grid],
    ids=["grid-input-first", "grid-from-convs", "image-after-grid"],
)
def test_grid_first_delegate_matches_converted_model(
    tmp_path: Path, case: Callable[[], Case]
) -> None:
    torch.manual_seed(0)
    model, inputs, input_qspecs = case()
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        input_qspecs=input_qspecs,
        output_qspecs=(snorm8(),),
    )
    converted = quantize(model.eval(), inputs, quantizer)
    expected = converted(*inputs)
    partitioner = GridSamplerPartitioner()
    program = to_edge_transform_and_lower(
        torch.export.export(converted, inputs, strict=True),
        partitioner=[partitioner, XnnpackPartitioner()],
    )
    assert not partitioner.rejections
    assert "XnnpackBackend" in _backends(program.exported_program())
    (blob,) = _grid_sampler_blobs(program.exported_program())
    decoded = decode(blob)
    # The case this test is for: the grid is the delegate's first runtime argument.
    assert decoded.roles == ArgumentRoles(inputs=2, image=1, grid=0)
    assert decoded.op.image is not None and decoded.op.grid is not None
    assert decoded.op.grid.dtype == torch.int16
    path = tmp_path / "model.pte"
    path.write_bytes(program.to_executorch().buffer)
    runtime.register()
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute(list(inputs))
    steps = ((actual - expected).abs() * 127).round().max().item()
    assert steps <= 1, steps


INT8_Q = QParams(1 / 127, 0, -127, 127, torch.int8)


class OneQuantizedTensor(torch.nn.Module):
    """One int8 tensor, dequantized once, is both the image and the (int8) grid."""

    def forward(self, x_q: torch.Tensor) -> torch.Tensor:
        q = INT8_Q
        x = torch.ops.quantized_decomposed.dequantize_per_tensor(
            x_q, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
        )
        out = F.grid_sample(x, x, padding_mode="zeros", align_corners=True)
        result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(
            out, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
        )
        return result


def test_one_quantized_tensor_as_image_and_grid(tmp_path: Path) -> None:
    torch.manual_seed(1)
    x_q = torch.randint(-127, 128, (2, 3, 5, 2), dtype=torch.int8)
    partitioner = GridSamplerPartitioner()
    program = to_edge_transform_and_lower(
        torch.export.export(OneQuantizedTensor(), (x_q,), strict=True), partitioner=[partitioner]
    )
    (blob,) = _grid_sampler_blobs(program.exported_program())
    assert decode(blob).roles == ArgumentRoles(inputs=1, image=0, grid=0)
    path = tmp_path / "one.pte"
    path.write_bytes(program.to_executorch().buffer)
    runtime.register()
    (actual,) = Runtime.get().load_program(path).load_method("forward").execute([x_q])
    op = GridSampleOp(
        padding_mode="zeros", align_corners=True, image=INT8_Q, grid=INT8_Q, output=INT8_Q
    )
    assert torch.equal(actual, cpu.grid_sample(x_q, x_q, op))
