"""channels_last on a real edge program: which tensors become NHWC, and grids that do not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge

from etkit_layout import channels_last, channels_last_nodes, grid_tensors
from etkit_quant import (
    BoundaryQuantizer,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    quantize,
    snorm8,
    snorm16,
)


class Warp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return self.conv(F.grid_sample(self.conv(image), grid * 0.9, align_corners=False))


def _edge_program() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    inputs = (torch.rand(1, 4, 8, 8) * 2 - 1, torch.rand(1, 5, 6, 2) * 2 - 1)
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        input_qspecs=(snorm8(), snorm16()),
        output_qspecs=(snorm8(),),
    )
    converted = quantize(Warp().eval(), inputs, quantizer)
    program = to_edge(torch.export.export(converted, inputs, strict=True)).exported_program()
    gm: torch.fx.GraphModule = program.graph_module
    return gm


def _is_nhwc(node: torch.fx.Node) -> bool:
    value = node.meta["val"]
    return (
        bool(value.is_contiguous(memory_format=torch.channels_last)) and not value.is_contiguous()
    )


def test_marks_image_boundaries_and_grid_sampler_but_not_grids() -> None:
    gm = _edge_program()
    result = channels_last(gm)
    assert result.modified
    nodes = {n.name: n for n in gm.graph.nodes}
    image, grid = nodes["image"], nodes["grid"]
    assert _is_nhwc(image) and not _is_nhwc(grid)
    (image_q,) = [u for u in image.users if is_quantize(u)]
    assert _is_nhwc(image_q)
    (sampler,) = [n for n in gm.graph.nodes if is_grid_sampler(n)]
    image_dq, grid_dq = sampler.args[0], sampler.args[1]
    assert _is_nhwc(image_dq) and _is_nhwc(image_dq.args[0]) and _is_nhwc(sampler)
    assert all(_is_nhwc(u) for u in sampler.users if is_quantize(u))
    # the grid path keeps N x H x W x 2, contiguous, through every Q/DQ
    assert grid_dq in grid_tensors(gm) and grid_dq.args[0] in grid_tensors(gm)
    for node in grid_tensors(gm):
        assert node.meta["val"].is_contiguous()
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert is_dequantize(output) and _is_nhwc(output) and _is_nhwc(output.args[0])
    # and nothing else: the conv in the middle keeps its layout
    marked = set(channels_last_nodes(gm))
    assert all("convolution" not in n.name for n in marked)


def test_second_run_changes_nothing() -> None:
    gm = _edge_program()
    assert channels_last(gm).modified
    assert not channels_last(gm).modified
