"""``gather_position_nodes``: the positions and weights of warps written as index gathers stay in
float (``BoundaryQuantizer``, ``grid_math="float"``), so a quantized gather reads the pixels the
float model reads; the gathered values and what they meet are quantized."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
)
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config as xnnpack_config,
)
from torch.fx import GraphModule
from torchao.quantization.pt2e.quantizer import Quantizer

from etkit_quant import BoundaryQuantizer, is_dequantize, observed_int8, quantize
from etkit_quant.gather_positions import gather_position_nodes
from etkit_quant.graph import target_name

H, W = 8, 12


def _grid(h: int, w: int) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([ys, xs]).float()[None]


class NearestWarp(torch.nn.Module):
    """A backward warp by index gathers, as the Model Gym's ``backward_warp_nearest`` writes it:
    rounded flow, clamped positions, ``flat[y * W + x]``."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        query = _grid(H, W) - torch.round(flow)
        y = torch.clamp(query[:, 0], 0, H - 1).to(torch.int32)
        x = torch.clamp(query[:, 1], 0, W - 1).to(torch.int32)
        flat = image.permute(0, 2, 3, 1).reshape(H * W, -1)
        return flat[y * W + x].permute(0, 3, 1, 2)


class LerpWarp(torch.nn.Module):
    """A horizontal linear-interpolation warp by two index gathers, weighted by ``lerp``
    weights of the positions (the Model Gym's ``sample_bilinear``, one axis), then a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        x = _grid(H, W)[:, 1] - flow[:, 0]
        x0 = torch.floor(x)
        w1 = x - x0
        flat = image.permute(0, 2, 3, 1).reshape(H * W, -1)
        rows = (_grid(H, W)[:, 0] * W).to(torch.int32)
        i0 = rows + torch.clamp(x0, 0, W - 1).to(torch.int32)
        i1 = rows + torch.clamp(x0 + 1, 0, W - 1).to(torch.int32)
        mixed = flat[i0] * (1 - w1)[..., None] + flat[i1] * w1[..., None]
        return self.conv(mixed.permute(0, 3, 1, 2))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    image = torch.rand(1, 3, H, W, generator=generator)
    # pixels, away from the nearest warp's rounding edges (int8 moves a flow by ~0.01 px)
    whole = torch.randint(-3, 4, (1, 2, H, W), generator=generator).float()
    flow = whole + 0.3 * (2 * torch.rand(1, 2, H, W, generator=generator) - 1)
    return image, flow


def _bases() -> dict[str, Quantizer]:
    vgf = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+FP+int16"))
    vgf.set_global(get_symmetric_quantization_config())
    return {"vgf": vgf, "xnnpack": XNNPACKQuantizer().set_global(xnnpack_config())}


def _graph(model: torch.nn.Module) -> GraphModule:
    return torch.export.export(model, _inputs(), strict=True).module(check_guards=False)


def _names(nodes: set[torch.fx.Node]) -> set[str]:
    return {target_name(n).removesuffix(".default") for n in nodes}


def test_the_positions_and_their_weights_are_the_region() -> None:
    graph = _graph(LerpWarp())
    region = gather_position_nodes(graph)
    names = _names(region)
    assert {"aten::floor", "aten::clamp", "aten::sub.Tensor"} <= names
    values = [n.meta.get("val") for n in region]  # a tensor, or a list for a multi-output op
    assert any(isinstance(v, torch.Tensor) and v.dtype == torch.int32 for v in values)
    # the weights (1 - w1, w1) are computed from the positions alone: float too
    weights = [n for n in region if target_name(n) == "aten::rsub.Scalar"]
    assert weights
    # the gathers, what they read and what meets the gathered values are not
    assert not any(target_name(n) in ("aten::index.Tensor", "aten::convolution") for n in region)
    assert not any(n.op == "placeholder" for n in region)
    mixes = [n for n in graph.graph.nodes if target_name(n) == "aten::mul.Tensor"]
    assert any(n not in region for n in mixes)


def test_a_graph_without_gathers_has_no_region() -> None:
    class Plain(torch.nn.Module):
        def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
            return image * 2 + flow[:, :1]

    assert gather_position_nodes(_graph(Plain())) == set()


@pytest.mark.parametrize("base", ["vgf", "xnnpack"])
@pytest.mark.parametrize("model", [NearestWarp, LerpWarp])
def test_quantized_gathers_read_the_pixels_the_float_model_reads(
    model: type[torch.nn.Module], base: str
) -> None:
    """Quantized (int8 image and flow), a gather warp stays as close to the float model as one
    rounding of the image; with the positions in int8 the wrong pixels were read."""
    torch.manual_seed(0)
    net = model().eval()
    inputs = _inputs()
    quantizer = BoundaryQuantizer(
        _bases()[base], input_qspecs=(observed_int8(),) * 2, output_qspecs=(observed_int8(),)
    )
    converted = quantize(net, inputs, quantizer)
    assert quantizer.coordinate_nodes  # the positions
    with torch.no_grad():
        want, got = net(*inputs), converted(*inputs)
    peak = float(want.max() - want.min())
    psnr = 10 * torch.log10(peak**2 / ((want - got) ** 2).mean())
    assert psnr > 35.0, float(psnr)
    for node in converted.graph.nodes:
        if target_name(node) == "aten::index.Tensor":
            (index,) = node.args[1]  # type: ignore[misc]
            assert not is_dequantize(index)  # integer positions, computed in float


class PredictedLerpWarp(LerpWarp):
    """``LerpWarp`` on a flow a convolution predicts: the conv's output enters the positions."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(2, 2, 1)
        with torch.no_grad():  # the identity: the predicted flow is the given one
            self.flow.weight.copy_(torch.eye(2)[:, :, None, None])
            self.flow.bias.zero_()

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        return super().forward(image, self.flow(flow))


def test_rounding_a_predicted_flow_is_measured_at_the_positions_gathers_round() -> None:
    """``coordinate_position_error`` measures, in pixels, how far int8 moves the positions a
    warp written as gathers rounds (the input of its ``floor``): half an int8 step of the
    flow's range at most, and int16 a hundredth of that."""
    from etkit_quant.calibration import coordinate_position_error
    from etkit_quant.gather_positions import rounded_positions

    graph = _graph(PredictedLerpWarp())
    rounded = rounded_positions(graph)
    assert rounded and all(n.meta["val"].dtype == torch.float32 for n in rounded)
    example = _inputs()
    int8 = coordinate_position_error(graph, [example])
    int16 = coordinate_position_error(graph, [example], bits=16)
    flow = example[1]  # the conv's output: both channels
    step = (float(flow.max()) - min(float(flow.min()), 0.0)) / 254
    assert step / 20 < int8 <= step / 2 * 1.01 + 1e-6
    assert 0 < int16 < int8 / 100
    # a flow given as input is quantized as a grid, at the boundary: nothing enters
    assert coordinate_position_error(_graph(LerpWarp()), [example]) == 0.0
