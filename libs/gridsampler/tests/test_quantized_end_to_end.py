"""End to end: a PT2E-quantized model whose grid samplers are lowered to this backend (the rest
to the portable kernels) runs in executorch.runtime and matches the converted model within one
quantization step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

from etkit_gridsampler import GridSamplerPartitioner, delegate_format, runtime
from etkit_quant import BoundaryQuantizer, quantize, snorm8, snorm16


class Resample(torch.nn.Module):
    """An image and a grid from outside; the sampled image out."""

    def __init__(self, mode: str, padding: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(
            image, grid, mode=self.mode, padding_mode=self.padding, align_corners=self.align_corners
        )


class FlowWarp(torch.nn.Module):
    """grid = pixel grid + predicted flow, computed in float; frame 0 warped."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(6, 2, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        base = torch.stack((grid_x, grid_y), -1).unsqueeze(0)
        grid = base + self.flow(torch.cat([frame0, frame1], 1)).permute(0, 2, 3, 1) * 0.2
        return F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)


def _lower_and_run(
    converted: torch.fx.GraphModule,
    inputs: tuple[torch.Tensor, ...],
    path: Path,
    fuse_grid_quantize: bool = False,
    grid_from_input: bool = False,
) -> tuple[torch.Tensor, GridSamplerPartitioner]:
    partitioner = GridSamplerPartitioner(fuse_grid_quantize=fuse_grid_quantize)
    program = to_edge_transform_and_lower(
        torch.export.export(converted, inputs, strict=True), partitioner=[partitioner]
    )
    delegates = [
        getattr(program.exported_program().graph_module, str(n.target))
        for n in program.exported_program().graph.nodes
        if n.op == "get_attr" and str(n.target).startswith("lowered_module")
    ]
    assert delegates, partitioner.rejections
    for delegate in delegates:  # every delegate is a quantized unit: int8 image, int16 grid
        blob = delegate_format.decode(delegate.processed_bytes)
        op = blob.op
        assert op.image is not None and op.grid is not None and op.grid.dtype == torch.int16
        # a program input's quantize is the caller's (an exporter takes it out): never fused
        assert blob.quantizes_grid == (fuse_grid_quantize and not grid_from_input)
    outside = [
        n
        for n in program.exported_program().graph.nodes
        if n.op == "call_function"
        and "quantize_per_tensor" in str(n.target)
        and "dequantize" not in str(n.target)
        and n.meta["val"].dtype == torch.int16
    ]  # the grid's quantize: outside (a portable kernel) unless the delegate took it in
    assert len(outside) == (len(delegates) if grid_from_input or not fuse_grid_quantize else 0)
    path.write_bytes(program.to_executorch().buffer)
    runtime.register()
    (output,) = Runtime.get().load_program(path).load_method("forward").execute(list(inputs))
    return output, partitioner


@pytest.mark.parametrize(
    ("mode", "padding", "align_corners"),
    [("bilinear", "zeros", False), ("bilinear", "reflection", True), ("nearest", "border", False)],
)
def test_resample_matches_converted_model(
    tmp_path: Path, mode: str, padding: str, align_corners: bool
) -> None:
    torch.manual_seed(0)
    inputs = (torch.rand(2, 4, 12, 16) * 2 - 1, torch.rand(2, 9, 11, 2) * 2.4 - 1.2)
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        input_qspecs=(snorm8(), snorm16()),
        output_qspecs=(snorm8(),),
    )
    converted = quantize(Resample(mode, padding, align_corners).eval(), inputs, quantizer)
    expected = converted(*inputs)
    actual, _ = _lower_and_run(converted, inputs, tmp_path / "resample.pte")
    steps = ((actual - expected).abs() * 127).round().max().item()
    assert steps <= (0 if mode == "nearest" else 1), steps


def test_flow_warp_matches_converted_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    inputs = (torch.rand(1, 3, 16, 16) * 2 - 1, torch.rand(1, 3, 16, 16) * 2 - 1)
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        input_qspecs=(snorm8(), snorm8()),
        output_qspecs=(snorm8(),),
    )
    converted = quantize(FlowWarp().eval(), inputs, quantizer)
    expected = converted(*inputs)
    actual, partitioner = _lower_and_run(converted, inputs, tmp_path / "flow_warp.pte")
    assert not partitioner.rejections
    assert ((actual - expected).abs() * 127).round().max().item() <= 1


def test_a_grid_quantized_in_the_delegate_gives_the_portable_kernels_bits(tmp_path: Path) -> None:
    """The grid's quantize taken into the delegate (the XNNPACK target's programs) computes what
    ExecuTorch's portable quantize_per_tensor computed before the sampler, bit for bit, on a grid
    the program computes (tests/test_grid_quantize.py holds the quantize itself to the portable
    kernel on rounding ties, clamps and every instruction set); a grid that is a program input
    keeps its quantize outside, for the exporter to take out of the program."""
    torch.manual_seed(3)
    image = torch.rand(2, 3, 13, 21) * 2 - 1
    grid = torch.rand(2, 37, 29, 2) * 2.6 - 1.3
    cases = [
        (FlowWarp(), (image[:1], image[1:]), (snorm8(), snorm8()), False),
        (Resample("bilinear", "border", False), (image, grid), (snorm8(), snorm16()), True),
    ]
    for model, inputs, input_qspecs, from_input in cases:
        quantizer = BoundaryQuantizer(
            XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
            input_qspecs=input_qspecs,
            output_qspecs=(snorm8(),),
        )
        converted = quantize(model.eval(), inputs, quantizer)
        apart, _ = _lower_and_run(converted, inputs, tmp_path / "apart.pte", False, from_input)
        fused, _ = _lower_and_run(converted, inputs, tmp_path / "fused.pte", True, from_input)
        assert torch.equal(fused, apart), (type(model).__name__, (fused != apart).sum())
