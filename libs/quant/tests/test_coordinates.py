"""Integer where it counts: only the coordinate arithmetic between the last compute-heavy op and
a grid sampler's grid input stays float; the layers that predict a flow or theta are quantized,
with both bases, in models whose network exists to predict the grid."""

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
from quant_models import (
    CopiedGrid,
    FlowEstimator,
    RAFTShaped,
    RIFEShaped,
    STNClassifier,
    call_nodes,
    grid_sample_nodes,
    qparams_of,
    rand,
)
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import Quantizer

from etkit_quant import BoundaryQuantizer, is_dequantize, is_quantize, observed_int8, quantize
from etkit_quant.graph import (
    compute_kind,
    coordinate_inputs,
    coordinate_nodes,
    grid_position_nodes,
    is_coordinate_op,
    target_name,
)

MODELS = {
    "flow estimator": (FlowEstimator, lambda: (rand(1, 3, 12, 16), rand(1, 3, 12, 16))),
    "stn classifier": (STNClassifier, lambda: (rand(2, 1, 16, 16),)),
    "rife-shaped": (RIFEShaped, lambda: (rand(1, 3, 8, 12, low=0), rand(1, 3, 8, 12, low=0))),
    "raft-shaped": (RAFTShaped, lambda: (rand(1, 3, 16, 16), rand(1, 3, 16, 16))),
}


def vgf() -> Quantizer:
    quantizer = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+FP+int16"))
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def xnnpack() -> Quantizer:
    return XNNPACKQuantizer().set_global(xnnpack_config())


BASES = {"vgf": vgf, "xnnpack": xnnpack}
HEAVY = ("conv", "linear", "matmul")


def exported(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], GraphModule]:
    torch.manual_seed(3)
    cls, inputs = MODELS[name]
    model = cls().eval()
    example = inputs()
    graph = torch.export.export(model, example, strict=True).module(check_guards=False)
    return model, example, graph


def converted(name: str, base: str, **kwargs: object) -> tuple[GraphModule, BoundaryQuantizer]:
    model, example, _ = exported(name)
    count = 1
    quantizer = BoundaryQuantizer(
        BASES[base](),
        input_qspecs=(observed_int8(),) * len(example),
        output_qspecs=(observed_int8(),) * count,
        **kwargs,
    )
    return quantize(model, example, quantizer), quantizer


def float_heavy_ops(gm: GraphModule) -> list[str]:
    """The convs, linears and matmuls of a converted graph whose activation input is not a
    dequantize: they compute in float."""
    return [
        n.name
        for n in gm.graph.nodes
        if compute_kind(n) in HEAVY
        and not (isinstance(n.args[0], Node) and is_dequantize(n.args[0]))
    ]


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_conv_linear_or_matmul_runs_in_float(name: str, base: str) -> None:
    gm, _ = converted(name, base)
    heavy = [n for n in gm.graph.nodes if compute_kind(n) in HEAVY]
    assert heavy
    assert float_heavy_ops(gm) == []
    # the grid is still computed in float and quantized once, at the sampler: int16
    for sampler in grid_sample_nodes(gm):
        grid = sampler.args[1]
        assert isinstance(grid, Node) and is_dequantize(grid)
        assert qparams_of(grid)[4] == torch.int16
        producer = grid.args[0].args[0]  # type: ignore[union-attr]
        assert isinstance(producer, Node)
        assert not is_dequantize(producer), f"{sampler.name}: the grid was computed in integers"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_float_region_is_coordinate_arithmetic_only(name: str) -> None:
    _, _, graph = exported(name)
    region = coordinate_nodes(graph)
    assert region
    assert region <= grid_position_nodes(graph)
    for node in region:
        assert is_coordinate_op(node), node.format_node()
        assert compute_kind(node) is None or target_name(node).startswith("aten::affine_grid")
    entering = coordinate_inputs(graph, region)
    assert entering
    assert all(n not in region for n in entering)


def test_the_predicted_flow_gets_its_own_calibrated_qspec() -> None:
    """The flow conv's output (pixels, a few of them) is quantized with observed int8 that covers
    every calibrated value, not the base's histogram (which may trim a flow's extremes)."""
    model, example, graph = exported("flow estimator")
    (flow,) = coordinate_inputs(graph)
    assert flow.name == "conv2d_2"
    gm, quantizer = converted("flow estimator", "xnnpack")
    assert quantizer.coordinate_inputs == ("conv2d_2",)
    (conv,) = [n for n in gm.graph.nodes if n.name == "conv2d_2"]
    (quantize_node,) = [u for u in conv.users if is_quantize(u)]
    scale, zero_point, quant_min, quant_max, dtype = qparams_of(quantize_node)
    # observed_int8's full range: XNNPACK clamps int8 at -128 whatever the qspec says
    assert (quant_min, quant_max, dtype) == (-128, 127, torch.int8)
    with torch.no_grad():
        values = model.net(torch.cat(example, 1))
    low, high = (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
    assert low - scale / 2 <= float(values.min()) and float(values.max()) <= high + scale / 2
    assert float(values.abs().max()) > 1  # a flow in pixels: what SNORM8 would clip


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_calibrated_int8_range_is_what_the_backend_computes(base: str) -> None:
    """[-127, 127] on Arm's base (TOSA clamps to the qspec), [-128, 127] on XNNPACK's (it
    clamps int8 there whatever the qspec says: the program and the quantized model then clip
    alike), for the coordinate input and for every calibrated boundary alike."""
    quantizer = BoundaryQuantizer(
        BASES[base](), input_qspecs=(observed_int8(),), output_qspecs=(observed_int8(),)
    )
    low = -127 if base == "vgf" else -128
    for qspec in (
        quantizer.coordinate_input_qspec,
        *quantizer.input_qspecs,
        *quantizer.output_qspecs,
    ):
        assert qspec is not None and (qspec.quant_min, qspec.quant_max) == (low, 127)


@pytest.mark.parametrize("base", sorted(BASES))
def test_grid_math_int_quantizes_the_coordinate_arithmetic(base: str) -> None:
    gm, quantizer = converted("flow estimator", base, grid_math="int")
    assert quantizer.coordinate_nodes == ()
    adds = call_nodes(gm, lambda n: target_name(n) == "aten::add.Tensor")
    assert adds and all(
        all(is_dequantize(a) for a in n.all_input_nodes if a.op == "call_function") for n in adds
    )


def test_grid_math_is_checked() -> None:
    with pytest.raises(ValueError, match="grid_math must be one of 'float', 'int', got 'fp32'"):
        BoundaryQuantizer(xnnpack(), input_qspecs=(), output_qspecs=(), grid_math="fp32")  # type: ignore[arg-type]


def test_the_chain_is_followed_through_casts_asserts_in_place_copies_and_constants() -> None:
    model = CopiedGrid().eval()
    example = (rand(1, 3, 6, 8),)
    graph = torch.export.export(model, example, strict=True).module(check_guards=False)
    names = {target_name(n) for n in graph.graph.nodes}
    assert {"aten::_assert_tensor_metadata", "aten::copy_", "aten::to.dtype"} <= names
    region = coordinate_nodes(graph)
    copies = [n for n in graph.graph.nodes if target_name(n) == "aten::copy_"]
    (zeros,) = [n for n in graph.graph.nodes if target_name(n) == "aten::zeros"]
    (cast,) = [n for n in graph.graph.nodes if target_name(n) == "aten::to.dtype"]
    muls = [n for n in graph.graph.nodes if target_name(n) == "aten::mul.Tensor"]
    assert len(copies) == 2 and set(copies) <= region
    assert zeros in region and cast in region and set(muls) <= region  # 0-dim constant factor
    assert [n.name for n in coordinate_inputs(graph, region)] == ["conv2d"]


def test_a_small_matrix_product_is_coordinate_arithmetic_and_a_wide_one_is_not() -> None:
    class Products(torch.nn.Module):
        def forward(self, theta: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
            positions = torch.ones(1, 6, 3)  # homogeneous (x, y, 1)
            moved = torch.bmm(positions, theta.transpose(1, 2))  # 3 wide: coordinates
            return moved + torch.bmm(features, features.transpose(1, 2)).sum()

    graph = torch.export.export(Products(), (rand(1, 2, 3), rand(1, 6, 16)), strict=True).module(
        check_guards=False
    )
    small, wide = [n for n in graph.graph.nodes if target_name(n) == "aten::bmm"]
    assert is_coordinate_op(small) and not is_coordinate_op(wide)
    assert compute_kind(wide) == "matmul"


def test_inputs_flowing_only_into_coordinate_arithmetic_default_to_int16() -> None:
    """A flow in pixels and a theta given as inputs (not grid-shaped) are quantized like grids;
    the frames a flow network reads are not."""
    from etkit_quant import default_qspecs, fixed_qparams, observe_ranges

    class Inputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)

        def forward(
            self, image: torch.Tensor, flow: torch.Tensor, theta: torch.Tensor
        ) -> torch.Tensor:
            from quant_models import warp_by_pixels

            grid = torch.nn.functional.affine_grid(theta, list(image.shape), align_corners=False)
            moved = torch.nn.functional.grid_sample(image, grid, align_corners=False)
            return warp_by_pixels(moved, flow + self.conv(image))

    example = (rand(1, 3, 8, 12), rand(1, 2, 8, 12, low=-6, high=6), rand(1, 2, 3))
    graph = torch.export.export(Inputs().eval(), example, strict=True).module(check_guards=False)
    observation = observe_ranges(graph, [example])
    image, flow, theta = observation.inputs
    assert (image.coordinates, flow.coordinates, theta.coordinates) == (False, True, True)
    qspecs = default_qspecs(observation).input_qspecs
    assert qspecs[0] is not None and qspecs[0].dtype == torch.int8
    for qspec, observed in zip(qspecs[1:], (flow, theta), strict=True):
        assert qspec is not None and qspec.dtype == torch.int16
        assert fixed_qparams(qspec).high >= observed.max_abs  # covers it: nothing clipped


def test_the_clipping_report_covers_the_predicted_flow() -> None:
    """The flow entering the coordinate arithmetic is reported whatever its parameters; a
    fixed SNORM8 range given to it (as a fixed-range base would) is reported clipping."""
    from etkit_quant import clipping_report, snorm8

    _, example, _ = exported("flow estimator")
    gm, quantizer = converted("flow estimator", "xnnpack")
    (record,) = clipping_report(gm, [example], fixed=(), watch=quantizer.coordinate_inputs)
    assert record.name.startswith("coordinate input conv2d_2")
    assert record.count == 0 and record.passes()
    clipped, quantizer = converted("flow estimator", "xnnpack", coordinate_input_qspec=snorm8())
    (record,) = clipping_report(clipped, [example], fixed=(), watch=quantizer.coordinate_inputs)
    assert record.qspec.startswith("int8, scale 0.00787") and not record.passes()


def test_the_position_error_of_an_int8_flow_is_measured_in_pixels() -> None:
    from etkit_quant.calibration import coordinate_position_error

    _, example, graph = exported("flow estimator")
    int8 = coordinate_position_error(graph, [example])
    int16 = coordinate_position_error(graph, [example], bits=16)
    assert 0 < int16 < int8 / 100
    # a flow in pixels over ~255 levels: the rounding is at most half a step of its range
    torch.manual_seed(3)
    model = FlowEstimator().eval()
    with torch.no_grad():
        values = model.net(torch.cat(example, 1))
    step = (float(values.max()) - min(float(values.min()), 0.0)) / 254
    assert int8 <= step / 2 * 1.01 + 1e-6
