"""BoundaryQuantizer on real exported graphs, with the Arm VgfQuantizer and executorch's
XNNPACKQuantizer as bases."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from quant_models import (
    ChainedSamplers,
    CorrelationLookup,
    FlowWarp,
    GridFromInput,
    IterativeFlow,
    ManyInputsOutputs,
    MaskedBlend,
    NoGridSampler,
    ResidualWarp,
    SharedProducer,
    SpatialTransformer,
    TwoSamplersOneImage,
    WarpConcatFeatures,
    call_nodes,
    f32,
    float_region,
    grid_sample_nodes,
    mixed_quantized_inputs,
    pixel_grid,
    qparams_of,
    rand,
)
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant import (
    BoundaryQuantizer,
    fixed_qparams,
    is_dequantize,
    is_quantize,
    observed_int8,
    qformat,
    quantize,
    snorm8,
    snorm16,
    unorm8,
)
from etkit_quant.graph import target_name

SNORM8 = (f32(1 / 127), 0, -127, 127, torch.int8)
SNORM16 = (f32(1 / 32767), 0, -32767, 32767, torch.int16)


def vgf_base() -> VgfQuantizer:
    quantizer = VgfQuantizer(VgfCompileSpec())
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def expected(qspec: QuantizationSpec) -> tuple[float, int, int, int, torch.dtype]:
    p = fixed_qparams(qspec)
    return f32(p.scale), p.zero_point, p.quant_min, p.quant_max, p.dtype


def run(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    input_qspecs: Sequence[QuantizationSpec | None],
    output_qspecs: Sequence[QuantizationSpec | None],
    **kwargs: object,
) -> GraphModule:
    quantizer = BoundaryQuantizer(
        vgf_base(), input_qspecs=input_qspecs, output_qspecs=output_qspecs, **kwargs
    )
    return quantize(model.eval(), inputs, quantizer)


def assert_grid_samplers_quantized(gm: GraphModule, output: tuple[object, ...] = SNORM8) -> None:
    samplers = grid_sample_nodes(gm)
    assert samplers
    for sampler in samplers:
        image, grid = sampler.args[0], sampler.args[1]
        assert isinstance(image, Node) and isinstance(grid, Node)
        assert is_dequantize(grid) and qparams_of(grid) == SNORM16, sampler.name
        grid_quantize = grid.args[0]
        assert isinstance(grid_quantize, Node) and is_quantize(grid_quantize)
        assert qparams_of(grid_quantize) == SNORM16
        assert is_dequantize(image) and qparams_of(image) == SNORM8, sampler.name
        (out,) = sampler.users
        assert is_quantize(out) and qparams_of(out) == output
        # grid positions: computed in float, quantized once, at the grid sampler
        producer = grid_quantize.args[0]
        assert isinstance(producer, Node)
        if producer.op == "call_function":
            region = float_region(producer)
            assert not [n.name for n in region if is_quantize(n)], sampler.name


def assert_boundaries(
    gm: GraphModule,
    input_qspecs: Sequence[QuantizationSpec | None],
    output_qspecs: Sequence[QuantizationSpec | None],
) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder" and n.users]
    for node, qspec in zip(placeholders, input_qspecs, strict=True):
        quantizes = [u for u in node.users if is_quantize(u)]
        if qspec is None:
            assert not quantizes or all(qparams_of(q)[0] != 0 for q in quantizes)
            continue
        assert len(quantizes) == len(node.users) == 1, node.name
        assert qparams_of(quantizes[0]) == expected(qspec), node.name
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = list(output_node.args[0])  # type: ignore[arg-type]
    for k, (node, qspec) in enumerate(zip(results, output_qspecs, strict=True)):
        if qspec is None:
            assert not is_dequantize(node), f"output {k} should be float"
            continue
        assert is_dequantize(node) and qparams_of(node) == expected(qspec), f"output {k}"
        assert qparams_of(node.args[0]) == expected(qspec)  # type: ignore[arg-type]


@pytest.mark.parametrize("channels", [3, 4])
def test_grid_from_model_input(channels: int) -> None:
    ins, outs = (snorm8(), snorm16()), (snorm8(),)
    gm = run(GridFromInput(channels), (rand(1, channels, 8, 8), rand(1, 6, 5, 2)), ins, outs)
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, ins, outs)


def test_grid_computed_from_pixel_grid_and_flow() -> None:
    ins, outs = (snorm8(), snorm8()), (snorm8(),)
    gm = run(FlowWarp(), (rand(1, 3, 16, 16), rand(1, 3, 16, 16)), ins, outs)
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, ins, outs)
    # the flow conv's only use is the grid, but it is a network layer: int8, like any other;
    # only the coordinate arithmetic after it (scale, permute, plus the pixel grid) is float
    (sampler,) = grid_sample_nodes(gm)
    region = float_region(sampler.args[1].args[0].args[0])  # type: ignore[union-attr]
    assert region and not any("conv" in n.name for n in region)
    assert {"mul", "permute", "add"} <= {n.name for n in region}


def test_affine_grid_spatial_transformer() -> None:
    gm = run(SpatialTransformer(), (rand(2, 4, 12, 12),), (snorm8(),), (snorm8(),))
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, (snorm8(),), (snorm8(),))


def test_one_image_two_grid_samplers() -> None:
    ins = (snorm8(), snorm16(), snorm16())
    gm = run(
        TwoSamplersOneImage(), (rand(1, 4, 8, 8), rand(1, 4, 4, 2), rand(1, 4, 4, 2)), ins, (None,)
    )
    assert len(grid_sample_nodes(gm)) == 2
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, ins, (None,))


def test_two_grid_samplers_chained() -> None:
    ins, outs = (snorm8(), snorm16(), None), (snorm8(),)
    gm = run(ChainedSamplers(), (rand(1, 3, 8, 8), rand(1, 6, 6, 2), rand(1, 5, 5, 2)), ins, outs)
    first, second = grid_sample_nodes(gm)
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, ins, outs)
    # the second sampler's image is the first one's output, requantized nowhere in between
    assert second.args[0].args[0] is next(iter(first.users))  # type: ignore[union-attr]


def test_shared_producer_stays_quantized() -> None:
    outs = (snorm8(), snorm8())
    gm = run(SharedProducer(), (rand(1, 3, 8, 8),), (snorm8(),), outs)
    assert_grid_samplers_quantized(gm)
    assert_boundaries(gm, (snorm8(),), outs)
    # the flow conv also feeds the head conv: one int8 quantization, with the calibrated
    # parameters of a tensor entering the coordinate arithmetic (observed_int8: [-127, 127]),
    # read by the head conv and, dequantized, by the coordinate arithmetic
    (flow_conv,) = [n for n in call_nodes(gm, lambda n: "conv" in n.name) if n.name == "conv2d"]
    (quantize,) = [u for u in flow_conv.users if is_quantize(u)]
    scale, _, quant_min, _, dtype = qparams_of(quantize)
    assert dtype == torch.int8 and quant_min == -127 and scale != SNORM8[0]
    assert len(flow_conv.users) == 1


def test_no_grid_sampler() -> None:
    gm = run(NoGridSampler(), (rand(1, 3, 8, 8),), (snorm8(),), (snorm8(),))
    assert not grid_sample_nodes(gm)
    assert_boundaries(gm, (snorm8(),), (snorm8(),))


@pytest.mark.parametrize(
    ("ins", "outs"),
    [
        ((snorm8(), None, unorm8()), (qformat(5), None, snorm8())),
        ((None, None, None), (snorm8(), snorm8(), None)),
        ((unorm8(), snorm8(), snorm8()), (None, None, None)),
    ],
)
def test_several_inputs_and_outputs_with_a_mix(
    ins: tuple[QuantizationSpec | None, ...], outs: tuple[QuantizationSpec | None, ...]
) -> None:
    inputs = (rand(1, 3, 4, 4, low=0), rand(1, 3, 4, 4), rand(1, 3, 4, 4, low=0))
    gm = run(ManyInputsOutputs(), inputs, ins, outs)
    assert_boundaries(gm, ins, outs)


def test_float_grid_sampler_output_and_float_grid() -> None:
    gm = run(
        GridFromInput(3),
        (rand(1, 3, 8, 8), rand(1, 6, 5, 2)),
        (snorm8(), None),
        (snorm8(),),
        grid_sampler_grid_qspec=None,
        grid_sampler_output_qspec=None,
    )
    (sampler,) = grid_sample_nodes(gm)
    assert not is_dequantize(sampler.args[1])  # type: ignore[arg-type]
    # the sampler writes float; the conv after it quantizes its own input, with observed params
    assert all(qparams_of(u) != SNORM8 for u in sampler.users if is_quantize(u))


def test_converted_graph_matches_float_model_closely() -> None:
    model = FlowWarp().eval()
    inputs = (rand(1, 3, 16, 16), rand(1, 3, 16, 16))
    gm = run(model, inputs, (snorm8(), snorm8()), (snorm8(),))
    error = (gm(*inputs) - model(*inputs)).abs().max().item()
    assert error < 0.1, error


# -- XNNPACK as base --------------------------------------------------------------------------


def test_xnnpack_base() -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    base = XNNPACKQuantizer().set_global(xnnpack_config())
    quantizer = BoundaryQuantizer(base, input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    model = NoGridSampler().eval()
    inputs = (rand(1, 3, 8, 8),)
    gm = quantize(model, inputs, quantizer)
    assert_boundaries(gm, (snorm8(),), (snorm8(),))
    flow_quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(xnnpack_config()),
        input_qspecs=(snorm8(), snorm8()),
        output_qspecs=(snorm8(),),
    )
    flow_gm = quantize(FlowWarp().eval(), (rand(1, 3, 8, 8), rand(1, 3, 8, 8)), flow_quantizer)
    assert_grid_samplers_quantized(flow_gm)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_xnnpack_batch_norm_patterns_left_out_only_where_no_batch_norm_is(
    batch_norm: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XNNPACK's quantizer exports its conv + batch-norm patterns on every call; etkit leaves
    them out of a graph without a batch norm, and the annotations stay the base's own."""
    import torchao.quantization.pt2e.utils as pt2e_utils
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    from etkit_quant.boundary import _annotate_with

    class ConvNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4) if batch_norm else torch.nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.bn(self.conv(x)))

    inputs = (rand(1, 3, 8, 8),)
    model = ConvNet().train()  # QAT-style: a training batch norm is what conv_bn matches

    def annotations(annotate: object) -> list[tuple[str, bool]]:
        gm = torch.export.export(model, inputs, strict=True).module()
        annotate(gm)  # type: ignore[operator]
        return [(n.name, "quantization_annotation" in n.meta) for n in gm.graph.nodes]

    base = XNNPACKQuantizer().set_global(xnnpack_config(is_qat=True))
    reference = annotations(base.annotate)  # the base alone, every pattern
    built: list[object] = []
    real = xnnpack_quantizer_utils._get_aten_graph_module_for_pattern

    def counting(*args: object, **kwargs: object) -> object:
        built.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(xnnpack_quantizer_utils, "_get_aten_graph_module_for_pattern", counting)
    assert pt2e_utils._get_aten_graph_module_for_pattern is real
    assert annotations(lambda gm: _annotate_with(base, gm)) == reference
    assert bool(built) == batch_norm  # patterns exported only where they could match
    assert "SUPPORTED_PATTERNS" not in vars(base)  # the base is left as it was


def test_an_output_the_base_leaves_float_keeps_its_inputs_parameters_unless_it_moves_values() -> (
    None
):
    """XNNPACK's quantizer leaves a sigmoid unannotated; the SNORM8 output boundary quantizes the
    sigmoid's result, and its input (logits beyond [-1, 1]) keeps the conv's own calibrated
    parameters: with the boundary's it was clipped to [-1, 1] (the Model Gym's NSS autoencoder
    on XNNPACK: 30.1 dB from the float model, 43.9 now). A reshape at an output still shares."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            with torch.no_grad():
                self.conv.weight.mul_(8)  # logits well beyond [-1, 1]

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.conv(x)
            return torch.sigmoid(logits), torch.relu(logits).reshape(1, 4, -1)

    model, inputs = Logits().eval(), (rand(1, 3, 8, 8),)
    quantizer = BoundaryQuantizer(
        XNNPACKQuantizer().set_global(xnnpack_config()),
        input_qspecs=(snorm8(),),
        output_qspecs=(snorm8(), observed_int8()),
    )
    gm = quantize(model, inputs, quantizer)
    (sigmoid,) = [n for n in gm.graph.nodes if target_name(n) == "aten::sigmoid"]
    source = sigmoid.args[0]
    assert isinstance(source, Node) and is_dequantize(source)
    scale, _, low, high, _ = source.args[1:6]
    assert float(scale) * (high - low) > 2.5, source.args  # not SNORM8's [-1, 1]
    with torch.no_grad():
        got, want = gm(*inputs), model(*inputs)
    error = float((got[0] - want[0]).abs().max())
    assert error < 4 / 127, error  # a few SNORM8 steps (the logits step), not 0.27 (clipped)


# -- bad input --------------------------------------------------------------------------------


def test_wrong_counts_name_both() -> None:
    quantizer = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    with pytest.raises(ValueError, match="input_qspecs has 1 entries but the model has 2 user"):
        quantize(FlowWarp().eval(), (rand(1, 3, 8, 8), rand(1, 3, 8, 8)), quantizer)
    quantizer = BoundaryQuantizer(
        vgf_base(), input_qspecs=(snorm8(),), output_qspecs=(snorm8(), snorm8())
    )
    with pytest.raises(ValueError, match="output_qspecs has 2 entries but the model has 1 out"):
        quantize(NoGridSampler().eval(), (rand(1, 3, 8, 8),), quantizer)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="base must be a torchao PT2E Quantizer"):
        BoundaryQuantizer(object(), input_qspecs=(), output_qspecs=())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"input_qspecs\[0\] must be a torchao QuantizationSpec"):
        BoundaryQuantizer(vgf_base(), input_qspecs=("snorm8",), output_qspecs=())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="grid_sampler_grid_qspec must be"):
        BoundaryQuantizer(
            vgf_base(),
            input_qspecs=(),
            output_qspecs=(),
            grid_sampler_grid_qspec=1 / 32767,  # type: ignore[arg-type]
        )
    with pytest.raises(TypeError, match="must be a sequence of qspecs"):
        BoundaryQuantizer(vgf_base(), input_qspecs=snorm8(), output_qspecs=())  # type: ignore[arg-type]
    dynamic = QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=snorm8().observer_or_fake_quant_ctr,
        is_dynamic=True,
    )
    with pytest.raises(ValueError, match=r"output_qspecs\[0\] is dynamic"):
        BoundaryQuantizer(vgf_base(), input_qspecs=(), output_qspecs=(dynamic,))


def test_quantize_bad_arguments() -> None:
    quantizer = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        quantize(lambda x: x, (rand(1, 3, 8, 8),), quantizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="example_inputs must be a tuple"):
        quantize(NoGridSampler(), [rand(1, 3, 8, 8)], quantizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"example_inputs\[0\] must be a torch.Tensor"):
        quantize(NoGridSampler(), (3.0,), quantizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="quantizer must be a torchao PT2E Quantizer"):
        quantize(NoGridSampler(), (rand(1, 3, 8, 8),), "vgf")  # type: ignore[arg-type]


# -- values crossing grid samplers, shared weights, tied inputs, other integer types ----------


def xnnpack_base() -> object:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    return XNNPACKQuantizer().set_global(xnnpack_config())


def run_on(
    base: object,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    input_qspecs: Sequence[QuantizationSpec | None] | None = None,
    output_qspecs: Sequence[QuantizationSpec | None] | None = None,
) -> GraphModule:
    outputs = model.eval()(*inputs)
    count = len(outputs) if isinstance(outputs, tuple) else 1
    quantizer = BoundaryQuantizer(
        base,  # type: ignore[arg-type]
        input_qspecs=input_qspecs or (snorm8(),) * len(inputs),
        output_qspecs=output_qspecs or (None,) * count,
    )
    return quantize(model, inputs, quantizer)


CROSSING = {
    "mask-multiply": (MaskedBlend, 2),
    "concat-with-pre-sampler-features": (WarpConcatFeatures, 1),
    "residual-add": (ResidualWarp, 1),
    "iterated-flow": (IterativeFlow, 1),
    "correlation-lookup": (CorrelationLookup, 2),
    "shared-producer": (SharedProducer, 1),
}


@pytest.mark.parametrize("name", list(CROSSING))
def test_no_quantized_op_reads_both_integers_and_floats(name: str) -> None:
    """The grid-position subgraph runs in float and its producers stay quantized: every op the
    Arm backend lowers as quantized reads only dequantized inputs."""
    make, count = CROSSING[name]
    inputs = tuple(rand(1, 3, 16, 16) for _ in range(count))
    gm = run_on(vgf_base(), make(), inputs)
    assert grid_sample_nodes(gm)
    assert mixed_quantized_inputs(gm) == []


def _convs(gm: GraphModule) -> list[Node]:
    return call_nodes(gm, lambda n: n.target == torch.ops.aten.conv2d.default)


def test_every_op_reading_a_shared_weight_is_quantized_with_xnnpack() -> None:
    """XNNPACK's quantizer annotates only the first op reading a weight; the encoder applied to
    both frames must be quantized twice, each conv with its own weight and bias."""
    gm = run_on(xnnpack_base(), CorrelationLookup(), (rand(1, 3, 16, 16), rand(1, 3, 16, 16)))
    encoders = [c for c in _convs(gm) if c.meta["val"].shape[1] == 8]
    assert len(encoders) == 2
    for conv in encoders:
        assert is_dequantize(conv.args[0]) and is_dequantize(conv.args[1]), conv.name
    biases = [c.args[2] for c in encoders]
    assert biases[0] is not biases[1]


def _concatenations(gm: GraphModule) -> list[Node]:
    """The quantized ``cat`` nodes (every input dequantized)."""
    cats = call_nodes(gm, lambda n: n.target == torch.ops.aten.cat.default)
    return [n for n in cats if all(is_dequantize(a) for a in n.all_input_nodes)]


class OneConvTwoUses(torch.nn.Module):
    """The same conv computes a float output (the user's choice) and features that are
    quantized (read by a grid sampler)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(image))
        warped = F.grid_sample(features, pixel_grid(16, 16), align_corners=False)
        return self.conv(image), warped


def test_a_float_op_does_not_share_parameters_with_a_quantized_one() -> None:
    """XNNPACK serializes a shared bias once, for the first op reading it."""
    gm = run_on(
        xnnpack_base(), OneConvTwoUses(), (rand(1, 3, 16, 16),), output_qspecs=(None, snorm8())
    )
    quantized, floated = sorted(_convs(gm), key=lambda c: is_dequantize(c.args[1]), reverse=True)
    assert is_dequantize(quantized.args[1]) and not is_dequantize(floated.args[1])
    bias_targets = {c.args[2].target for c in (quantized, floated)}  # type: ignore[union-attr]
    assert len(bias_targets) == 2


@pytest.mark.parametrize("base", [vgf_base, xnnpack_base])
def test_a_sampler_output_concatenated_with_features_shares_one_scale(base: object) -> None:
    """The base reads all inputs of a ``cat`` with one scale: the grid sampler's SNORM8 output
    does not override that for its own input (XNNPACK then failed to load the concatenation:
    "Failed to create cat2 node", error 0x1)."""
    gm = run_on(base(), WarpConcatFeatures(), (rand(1, 3, 16, 16),))  # type: ignore[operator]
    (cat,) = _concatenations(gm)
    (out,) = cat.users
    params = {qparams_of(d) for d in cat.args[0]} | {qparams_of(out)}  # type: ignore[union-attr]
    assert len(params) == 1, params
    if base is xnnpack_base:
        assert params != {SNORM8}  # observed: the features' range, not clipped to [-1, 1]


@pytest.mark.parametrize("base", [vgf_base, xnnpack_base])
def test_sampler_outputs_reshaped_and_concatenated_stay_snorm8(base: object) -> None:
    gm = run_on(base(), CorrelationLookup(), (rand(1, 3, 16, 16), rand(1, 3, 16, 16)))  # type: ignore[operator]
    for sampler in grid_sample_nodes(gm):
        node = next(iter(sampler.users))
        while node.target != torch.ops.aten.cat.default:  # quantize, dequantize, view, ...
            if is_quantize(node) or is_dequantize(node):
                assert qparams_of(node) == SNORM8, node.name
            node = next(iter(node.users))
    (cat,) = _concatenations(gm)
    assert qparams_of(next(iter(cat.users))) == SNORM8


def test_a_float_output_is_computed_in_float() -> None:
    """``None`` for an output whose op the base quantized: the op computes in float (Arm
    cannot lower an op with integer inputs and a float output)."""
    gm = run(GridFromInput(3), (rand(1, 3, 8, 8), rand(1, 6, 5, 2)), (snorm8(), None), (None,))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    (conv,) = output.args[0]  # type: ignore[misc]
    assert is_dequantize(conv.args[0])  # reads the grid sampler's output
    assert not is_dequantize(conv.args[1])  # float weights
    assert conv.meta["custom"]["_arm_annotation_info"] == {"quantized": False}
    assert mixed_quantized_inputs(gm) == []


@pytest.mark.parametrize("base", [vgf_base, xnnpack_base])
def test_uint8_boundaries_are_requantized_for_int8_ops(base: object) -> None:
    """A UNORM8 input feeds int8 ops through a requantize (Arm: no uint8 PAD, XNNPACK: wrong
    results); with XNNPACK a UNORM8 output is requantized from the op's int8 too."""
    gm = run_on(base(), NoGridSampler(), (rand(1, 3, 8, 8, low=0),), (unorm8(),), (unorm8(),))  # type: ignore[operator]
    first_conv = _convs(gm)[0]
    assert qparams_of(first_conv.args[0])[4] == torch.int8  # type: ignore[arg-type]
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    (quantize_input,) = placeholder.users
    assert qparams_of(quantize_input)[4] == torch.uint8
    output = next(n for n in gm.graph.nodes if n.op == "output")
    (result,) = output.args[0]  # type: ignore[misc]
    assert qparams_of(result)[4] == torch.uint8


def _image_reads(gm: GraphModule) -> list[tuple[float, int, int, int, torch.dtype, bool]]:
    """The parameters each grid sampler reads its image with, and whether the image is
    requantized (a dequantize-quantize pair before it; on Arm with the clamp that keeps a
    narrowed range after the pair, ``narrow_ranges``)."""
    reads = []
    for sampler in grid_sample_nodes(gm):
        image = sampler.args[0]
        assert isinstance(image, Node) and is_dequantize(image)
        source = image.args[0]
        assert isinstance(source, Node) and is_quantize(source)
        before = source.args[0]
        if isinstance(before, Node) and before.target is torch.ops.aten.clamp.default:
            before = before.args[0].args[0].args[0]  # type: ignore[union-attr]  # narrow_ranges
        requantized = isinstance(before, Node) and is_dequantize(before)
        reads.append((*qparams_of(image), requantized))
    return reads


@pytest.mark.parametrize("base", [vgf_base, xnnpack_base])
def test_a_sampler_can_read_its_image_as_the_model_input_gives_it(base: object) -> None:
    """With ``grid_sampler_image_from_producer``, an image the model input already quantizes
    (here 1/32 steps) is read with the input's parameters, not with the samplers' observed
    int8 qspec (the exporter's calibrated default): no requantize before the sampler, which on
    VGF runs on the CPU. Without it, the sampler's own qspec applies and the image is
    requantized. (PT2E itself shares an input edge with its producer when dtype and qscheme
    match, as for a fixed symmetric image qspec.)"""
    inputs = (rand(1, 4, 8, 8, low=-3, high=3),)
    model = SpatialTransformer()
    for from_producer, expect in ((True, (*expected(qformat(5)), False)), (False, None)):
        quantizer = BoundaryQuantizer(
            base(),  # type: ignore[operator]
            input_qspecs=(qformat(5),),
            output_qspecs=(snorm8(),),
            grid_sampler_image_qspec=observed_int8(),
            grid_sampler_image_from_producer=from_producer,
        )
        gm = quantize(model.eval(), inputs, quantizer)
        (read,) = _image_reads(gm)
        if expect is not None:
            assert read == expect
        else:
            assert read[0] != expected(qformat(5))[0] and read[5] is True
        assert mixed_quantized_inputs(gm) == []


def test_an_image_arriving_in_float_takes_the_samplers_qspec() -> None:
    """A float input image (no qspec) is quantized with the samplers' image qspec, and a sampler
    reading another sampler's output reads it as it was written."""
    gm = run(
        GridFromInput(4),
        (rand(1, 4, 8, 8), rand(1, 6, 5, 2)),
        (None, snorm16()),
        (snorm8(),),
        grid_sampler_image_qspec=qformat(6),
        grid_sampler_image_from_producer=True,
    )
    assert [r[:5] for r in _image_reads(gm)] == [expected(qformat(6))]
    gm = run(
        ChainedSamplers(),
        (rand(1, 4, 8, 8), rand(1, 6, 5, 2), rand(1, 6, 5, 2)),
        (qformat(5), snorm16(), None),
        (snorm8(),),
        grid_sampler_output_qspec=qformat(6),
        grid_sampler_image_from_producer=True,
    )
    assert _image_reads(gm) == [(*expected(qformat(5)), False), (*expected(qformat(6)), False)]


class ConvReluHead(torch.nn.Module):
    """A head whose float output is a ReLU the base fused with its conv (a depth map)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(image))


@pytest.mark.parametrize("base", [vgf_base, xnnpack_base])
def test_a_float_output_fused_with_its_conv_leaves_the_conv_integer(base: object) -> None:
    """The ReLU computes in float; the conv it was fused with quantizes its own output (before,
    it kept integer inputs and no output parameters: the Arm lowering refused it, "No output
    quantization parameter found in node aten_convolution_default")."""
    gm = run_on(base(), ConvReluHead(), (rand(1, 3, 8, 8),), output_qspecs=(None,))  # type: ignore[operator]
    (conv,) = _convs(gm)
    assert is_dequantize(conv.args[0])
    assert "dequantize" in str(conv.args[1].target)  # type: ignore[union-attr]  # int8 weights
    (quantize_output,) = conv.users
    assert is_quantize(quantize_output)
    (dequantize_output,) = quantize_output.users
    (relu,) = dequantize_output.users
    assert relu.target == torch.ops.aten.relu.default
    assert [u.op for u in relu.users] == ["output"]


class IgnoresItsSecondInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, image: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.conv(image), -1, 1)


def test_an_input_nothing_reads_keeps_its_place_and_is_left_alone() -> None:
    """input_qspecs index every user input: one the model ignores (or whose readers a
    normalization removed) keeps its place, so a qspec per argument still fits, and it gets no
    quantize of its own."""
    quantizer = BoundaryQuantizer(
        vgf_base(), input_qspecs=(snorm8(), snorm16()), output_qspecs=(snorm8(),)
    )
    gm = quantize(IgnoresItsSecondInput().eval(), (rand(1, 3, 8, 8), rand(1, 2, 8, 8)), quantizer)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [len(n.users) for n in placeholders] == [1, 0]
    (reader,) = placeholders[0].users
    assert is_quantize(reader)
    assert (f32(reader.args[1]), *reader.args[2:5]) == SNORM8[:4]
    # the count is of every user input: one qspec for two arguments is still refused
    short = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    with pytest.raises(ValueError, match="input_qspecs has 1 entries but the model has 2 user"):
        quantize(IgnoresItsSecondInput().eval(), (rand(1, 3, 8, 8), rand(1, 2, 8, 8)), short)
