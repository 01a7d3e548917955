"""Calibration over many samples: checks, observed ranges, defaults from data, saturation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from quant_models import call_nodes, f32, grid_sample_nodes, qparams_of, rand
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant import (
    SATURATION_THRESHOLD,
    BoundaryQuantizer,
    boundary_fixed_qspecs,
    check_calibration,
    covering,
    default_qspec,
    default_qspecs,
    fixed_qparams,
    fixed_scale,
    is_dequantize,
    observe_ranges,
    observed_int8,
    qformat,
    quantize,
    saturation,
    saturation_report,
    snorm8,
    snorm16,
)

Samples = list[tuple[torch.Tensor, ...]]

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


class Logits(torch.nn.Module):
    """A classifier head: logits in [-20, 20] from an image in [-1, 1]."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image.mean(dim=(2, 3)) * 20 + image[:, :, 0, 0] * 0


class Normalized(torch.nn.Module):
    """Takes an image already normalized with ImageNet's mean and std ([-2.1, 2.7])."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(image))


class Depth(torch.nn.Module):
    """A depth map in metres, [0, 10]."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(image.sum(dim=1, keepdim=True) * 4) * 10


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1


class Warp(torch.nn.Module):
    """image and grid are model inputs; the sampler reads the grid as given."""

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, align_corners=False)


class Lookup(torch.nn.Module):
    """RAFT-like: the sampler's grid is computed (pixel coordinates normalized by the image
    size) and reaches far past [-1, 1]."""

    def forward(self, features: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        grid = coords / 4 - 1
        return F.grid_sample(features, grid, align_corners=True)


def exported(model: torch.nn.Module, sample: tuple[torch.Tensor, ...]) -> GraphModule:
    graph: GraphModule = torch.export.export(model.eval(), sample, strict=True).module(
        check_guards=False
    )
    return graph


def samples_of(make: Callable[[], tuple[torch.Tensor, ...]], n: int = 4) -> Samples:
    return [make() for _ in range(n)]


def vgf_base() -> VgfQuantizer:
    quantizer = VgfQuantizer(VgfCompileSpec())
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


# -- defaults chosen from data ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "make", "inputs", "outputs"),
    [
        pytest.param(
            Logits, lambda: (rand(1, 3, 4, 4),), [snorm8()], [observed_int8()], id="logits"
        ),
        pytest.param(
            Normalized,
            lambda: ((torch.rand(1, 3, 8, 8) - MEAN) / STD,),
            [observed_int8()],
            [snorm8()],
            id="mean-std-input",
        ),
        pytest.param(Depth, lambda: (rand(1, 3, 8, 8),), [snorm8()], [observed_int8()], id="depth"),
        pytest.param(
            Normalized,
            lambda: (torch.rand(1, 3, 8, 8),),
            [snorm8()],  # [0, 1]: SNORM8, not UNORM8 (see docs/libraries/quant-guide.md)
            [snorm8()],
            id="unit-interval",
        ),
        pytest.param(
            Identity,
            lambda: (rand(1, 3, 8, 8, low=-0.1, high=0.1),),
            [observed_int8()],  # uses a tenth of SNORM8's range: observed
            [observed_int8()],
            id="small-range",
        ),
    ],
)
def test_boundary_defaults_follow_the_data(
    model: Callable[[], torch.nn.Module],
    make: Callable[[], tuple[torch.Tensor, ...]],
    inputs: list[QuantizationSpec],
    outputs: list[QuantizationSpec],
) -> None:
    # (the model is made here, after the seed: made at collection its weights would depend on
    # what was collected before)
    module = model()
    samples = samples_of(make)
    observation = observe_ranges(exported(module, samples[0]), samples)
    defaults = default_qspecs(observation)
    assert list(defaults.input_qspecs) == inputs
    assert list(defaults.output_qspecs) == outputs


def test_grid_reaching_past_the_unit_square_gets_a_covering_int16_scale() -> None:
    samples = [(rand(1, 4, 8, 8), rand(1, 6, 6, 2, low=-1.5, high=1.5)) for _ in range(3)]
    samples[1][1][0, 0, 0, 0] = -1.5  # reaches 1.5 exactly
    observation = observe_ranges(exported(Warp(), samples[0]), samples)
    defaults = default_qspecs(observation)
    assert defaults.input_qspecs == (snorm8(), fixed_scale(2 / 32767, torch.int16))
    assert defaults.grid_sampler_grid_qspec == covering(1.5) == fixed_scale(2 / 32767)
    assert defaults.grid_sampler_image_qspec == snorm8()
    assert defaults.grid_sampler_output_qspec == snorm8()
    assert defaults.output_qspecs == (snorm8(),)
    assert observation.grid_sampler_grids[0].max_abs == 1.5


def test_computed_grid_far_outside_gets_its_power_of_two() -> None:
    # coords in [0, 15] pixels: grid = coords / 4 - 1 lies in [-1, 2.75]
    samples = [(rand(1, 4, 8, 8), torch.rand(1, 5, 5, 2) * 15) for _ in range(3)]
    observation = observe_ranges(exported(Lookup(), samples[0]), samples)
    grid = observation.grid_sampler_grids[0]
    assert grid.is_grid and grid.kind == "grid_sampler_grid" and 2 < grid.max < 2.75
    defaults = default_qspecs(observation)
    assert defaults.grid_sampler_grid_qspec == fixed_scale(4 / 32767)
    # coords are grid-shaped but not a grid in [-1, 1]: int16 covering [0, 15]
    assert defaults.input_qspecs[1] == fixed_scale(16 / 32767)


def test_data_in_the_unit_range_keeps_snorm_everywhere() -> None:
    samples = [(rand(1, 4, 8, 8), rand(1, 6, 6, 2)) for _ in range(3)]
    observation = observe_ranges(exported(Warp(), samples[0]), samples)
    defaults = default_qspecs(observation)
    assert defaults.kwargs() == {
        "input_qspecs": (snorm8(), snorm16()),
        "output_qspecs": (snorm8(),),
        "grid_sampler_image_qspec": snorm8(),
        "grid_sampler_grid_qspec": snorm16(),
        "grid_sampler_output_qspec": snorm8(),
    }
    quantizer = BoundaryQuantizer(vgf_base(), **defaults.kwargs())
    report = saturation_report(observation, quantizer)
    assert len(report) == 6 and all(s.count == 0 and s.passes() for s in report)


def test_sampler_image_outside_the_unit_range_is_observed() -> None:
    samples = [(rand(1, 4, 8, 8, low=-3, high=3), rand(1, 6, 6, 2)) for _ in range(2)]
    defaults = default_qspecs(observe_ranges(exported(Warp(), samples[0]), samples))
    assert defaults.grid_sampler_image_qspec == observed_int8()
    assert defaults.grid_sampler_output_qspec == observed_int8()


def test_integer_outputs_stay_as_they_are() -> None:
    class ArgMax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.argmax(dim=1), x * 2

    samples = [(rand(1, 5, 4),)]
    observation = observe_ranges(exported(ArgMax(), samples[0]), samples)
    assert observation.outputs[0].dtype == torch.int64
    assert default_qspec(observation.outputs[0]) is None
    assert default_qspecs(observation).output_qspecs == (None, observed_int8())


# -- observation --------------------------------------------------------------------------------


def test_observation_covers_every_sample_and_reports_progress() -> None:
    samples = [(torch.full((1, 3, 4, 4), float(k)) - 1,) for k in range(3)]  # -1, 0, 1
    samples[2][0][0, 0, 0, 0] = 7.5
    calls: list[tuple[int, int]] = []
    graph = exported(Depth(), samples[0])
    observation = observe_ranges(graph, samples, on_sample=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert observation.samples == 3
    (observed,) = observation.inputs
    assert (observed.name, observed.kind, observed.index, observed.node) == (
        "input 0 (image)",
        "input",
        0,
        "image",
    )
    assert (observed.min, observed.max, observed.count) == (-1.0, 7.5, 3 * 48)
    assert observed.shape == (1, 3, 4, 4) and observed.dtype == torch.float32
    assert observed.count_outside(*fixed_qparams(snorm8()).rounding_range) == 1
    (output,) = observation.outputs
    assert output.count == 3 * 16 and output.min >= 0 and output.max <= 10


def test_observation_does_not_modify_the_graph() -> None:
    samples = [(rand(1, 4, 8, 8), rand(1, 6, 6, 2, low=-2, high=2)) for _ in range(2)]
    graph = exported(Lookup(), (rand(1, 4, 8, 8), torch.rand(1, 6, 6, 2)))
    code, nodes = graph.code, [(n.name, n.op, n.target, n.args) for n in graph.graph.nodes]
    meta = [dict(n.meta) for n in graph.graph.nodes]
    observe_ranges(graph, samples)
    assert graph.code == code
    assert [(n.name, n.op, n.target, n.args) for n in graph.graph.nodes] == nodes
    assert [dict(n.meta) for n in graph.graph.nodes] == meta


def test_sampler_sites_are_args_0_and_1_and_the_output() -> None:
    samples = [(rand(1, 4, 8, 8), torch.rand(1, 5, 5, 2) * 15)]
    graph = exported(Lookup(), samples[0])
    observation = observe_ranges(graph, samples)
    (sampler,) = grid_sample_nodes(graph)
    image, grid = sampler.args[0], sampler.args[1]
    assert isinstance(image, Node) and isinstance(grid, Node)
    assert observation.grid_sampler_images[0].node == image.name
    assert observation.grid_sampler_grids[0].node == grid.name
    assert observation.grid_sampler_outputs[0].node == sampler.name
    assert observation.grid_sampler_grids[0].name == f"grid sampler 0 ({sampler.name}) grid"
    assert len(observation.ranges) == 2 + 1 + 3


def test_a_module_or_exported_program_is_accepted() -> None:
    samples = [(rand(1, 3, 4, 4),)]
    observation = observe_ranges(Logits().eval(), samples)
    assert observation.outputs[0].max_abs <= 20 and observation.outputs[0].count == 3
    program = torch.export.export(Logits().eval(), samples[0], strict=True)
    assert observe_ranges(program, samples) == observation


def test_nonfinite_values_inside_the_model_count_as_outside() -> None:
    class Log(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)

    sample = torch.full((1, 10), 0.5)
    sample[0, 3] = 0.0  # log(0) = -inf
    observation = observe_ranges(exported(Log(), (sample,)), [(sample,)])
    (output,) = observation.outputs
    assert output.nonfinite == 1 and output.count == 10
    assert output.min == output.max == pytest.approx(math.log(0.5))
    assert not output.within(-1, 1)
    result = saturation(output, snorm8())
    assert result is not None and result.count == 1 and result.fraction == 0.1


# -- saturation ---------------------------------------------------------------------------------


def known_values() -> torch.Tensor:
    """1000 values: 996 in [-1, 1] (both ends included), one a float32 ulp above 1 (it rounds
    onto SNORM8's and SNORM16's end: not clipped), one 0.6 SNORM8 steps above 1 (clipped by
    both: more than half a step out) and -1.5 and 3.0."""
    values = torch.linspace(-1, 1, 996)
    assert values[0] == -1 and values[-1] == 1
    outside = torch.tensor(
        [float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))), 1 + 0.6 / 127, -1.5, 3.0]
    )
    return torch.cat([values, outside])[torch.randperm(1000)].view(1, 10, 100)


def test_saturation_counts_the_values_themselves() -> None:
    values = known_values()
    samples = [(values[:, :5].contiguous(),), (values[:, 5:].contiguous(),)]
    observation = observe_ranges(
        exported(Identity(), samples[0]), samples, count_outside=[qformat(6)]
    )
    observed = observation.inputs[0]
    assert (observed.count, observed.min, observed.max) == (1000, -1.5, 3.0)

    result = saturation(observed, snorm8())
    assert result is not None
    assert (result.count, result.total, result.fraction) == (3, 1000, 0.003)
    assert (result.low, result.high) == (-1.0, 1.0)
    assert (result.observed_min, result.observed_max) == (-1.5, 3.0)
    assert result.qspec == "SNORM8 (int8, scale 1/127)" and result.name == "input 0 (x)"
    assert not result.passes() and SATURATION_THRESHOLD == 0.001
    assert result.instead() == covering(3.0, torch.int8) == fixed_scale(4 / 127, torch.int8)
    assert result.passes(threshold=0.003) and result.instead(threshold=0.005) is None
    assert "3 of 1000 calibration values (0.3 %)" in result.message()
    record = result.as_dict()
    assert record["outside"] == 3 and record["passes"] is False
    assert record["instead"] == "int8, fixed scale 4/127, range [-4, 4]"

    # qformat(6) holds [-127/64, 127/64]: only 3.0 lies outside; counted because asked for
    q6 = saturation(observed, qformat(6))
    assert q6 is not None and q6.count == 1 and q6.fraction == 0.001 and q6.passes()
    # int16 qspecs are checked against the same counts, and suggest int16
    s16 = saturation(observed, snorm16())
    assert s16 is not None and s16.count == 3 and s16.instead() == fixed_scale(4 / 32767)
    # a range holding everything needs no count; observed qspecs and float are not checked
    wide = saturation(observed, covering(3.0, torch.int8))
    assert wide is not None and wide.count == 0 and wide.instead() is None
    assert saturation(observed, observed_int8()) is None and saturation(observed, None) is None


def test_a_range_not_counted_is_refused_not_guessed() -> None:
    samples = [(known_values(),)]
    observed = observe_ranges(exported(Identity(), samples[0]), samples).inputs[0]
    # 0.5 / 127 steps: [-0.5, 0.5] widened by half a step
    with pytest.raises(
        ValueError, match=r"outside \[-0.501969, 0.501969\] were not count.*count_outside"
    ):
        saturation(observed, fixed_scale(0.5 / 127, torch.int8))


def test_saturation_report_of_the_old_defaults() -> None:
    """The exporter's old defaults (SNORM8 everywhere, SNORM16 grids) on a lookup model."""
    samples = [(rand(1, 4, 8, 8, low=-2, high=2), torch.rand(1, 5, 5, 2) * 15) for _ in range(2)]
    graph = exported(Lookup(), samples[0])
    quantizer = BoundaryQuantizer(
        vgf_base(), input_qspecs=(snorm8(), snorm16()), output_qspecs=(snorm8(),)
    )
    observation = observe_ranges(
        graph, samples, count_outside=boundary_fixed_qspecs(quantizer), on_sample=None
    )
    report = {s.name: s for s in saturation_report(observation, quantizer)}
    assert list(report) == [
        "input 0 (features)",
        "input 1 (coords)",
        "output 0 (grid_sampler)",
        "grid sampler 0 (grid_sampler) image",
        "grid sampler 0 (grid_sampler) grid",
        "grid sampler 0 (grid_sampler) output",
    ]
    image = report["grid sampler 0 (grid_sampler) image"]
    features = torch.cat([s[0].flatten() for s in samples])
    assert image.count == int((features.abs() > 1 + 0.5 / 127).sum()) and not image.passes()
    grid = report["grid sampler 0 (grid_sampler) grid"]
    grids = torch.cat([(s[1] / 4 - 1).flatten() for s in samples])
    assert grid.count == int((grids.abs() > 1 + 1 / 32767).sum()) and grid.fraction > 0.3
    assert grid.instead() == fixed_scale(4 / 32767)
    assert report["input 1 (coords)"].instead() == fixed_scale(16 / 32767)

    defaults = BoundaryQuantizer(vgf_base(), **default_qspecs(observation).kwargs())
    assert all(s.count == 0 for s in saturation_report(observation, defaults))


def test_saturation_report_checks_counts() -> None:
    samples = [(rand(1, 3, 4, 4),)]
    observation = observe_ranges(exported(Logits(), samples[0]), samples)
    quantizer = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(),), output_qspecs=())
    with pytest.raises(ValueError, match="output_qspecs has 0 entries but the model has 1"):
        saturation_report(observation, quantizer)


# -- checking samples ---------------------------------------------------------------------------


EXAMPLE = (torch.zeros(1, 3, 8, 8), torch.zeros(1, 4, 4, 2))


def _nan() -> torch.Tensor:
    x = torch.zeros(1, 3, 8, 8)
    x[0, 0, 0, :2] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    return x


@pytest.mark.parametrize(
    ("calibration", "error", "message"),
    [
        ([EXAMPLE, [EXAMPLE[0], EXAMPLE[1]]], TypeError, "calibration sample 1 must be a tuple"),
        ([EXAMPLE, (EXAMPLE[0],)], ValueError, "sample 1 has 1 inputs, but the model takes 2"),
        ([(EXAMPLE[0], 3)], TypeError, "sample 0, input 1 must be a torch.Tensor, got int"),
        (
            [EXAMPLE, EXAMPLE, (torch.zeros(1, 3, 4, 4), EXAMPLE[1])],
            ValueError,
            r"sample 2, input 0 has shape \[1, 3, 4, 4\], but the example input has \[1, 3, 8, 8\]",
        ),
        (
            [(EXAMPLE[0], EXAMPLE[1].double())],
            ValueError,
            "sample 0, input 1 has dtype torch.float64, but the example input has torch.float32",
        ),
        (
            [EXAMPLE, (_nan(), EXAMPLE[1])],
            ValueError,
            "calibration sample 1, input 0 is not finite: 2 NaN and 1 infinite values of 192",
        ),
        ([], ValueError, "calibration is empty"),
        (EXAMPLE[0], TypeError, "calibration must be an iterable of input tuples"),
        (EXAMPLE, TypeError, "calibration sample 0 must be a tuple of tensors"),
    ],
)  # fmt: skip
def test_bad_samples_are_named(calibration: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        check_calibration(calibration, EXAMPLE)  # type: ignore[arg-type]
    graph = exported(Warp(), (rand(1, 3, 8, 8), rand(1, 4, 4, 2)))
    with pytest.raises(error, match=message):
        observe_ranges(graph, calibration)  # type: ignore[arg-type]


def test_generators_are_read_once_and_example_inputs_checked() -> None:
    samples = check_calibration((EXAMPLE for _ in range(3)), EXAMPLE)
    assert len(samples) == 3 and samples[0] is EXAMPLE
    assert check_calibration(None, EXAMPLE) == [EXAMPLE]
    with pytest.raises(ValueError, match=r"example_inputs \(the calibration sample\), input 0"):
        check_calibration(None, (_nan(),))


def test_quantize_checks_samples_before_any_work() -> None:
    class Unexportable(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x  # strict export fails on this

    quantizer = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(),), output_qspecs=(snorm8(),))
    with pytest.raises(ValueError, match="calibration sample 1, input 0 is not finite"):
        calibration = [(torch.ones(1, 3, 8, 8),), (_nan(),)]
        quantize(Unexportable(), (torch.ones(1, 3, 8, 8),), quantizer, calibration=calibration)


# -- quantize over many samples -----------------------------------------------------------------


def test_quantize_calibrates_on_every_sample_with_the_chosen_defaults() -> None:
    samples = [(rand(1, 4, 8, 8), rand(1, 6, 6, 2, low=-1.5, high=1.5)) for _ in range(4)]
    samples[2][0][0, 0, 0, 0] = -3.0  # only sample 2 reaches past [-1, 1]
    graph = exported(Warp(), samples[0])
    observation = observe_ranges(graph, samples)
    defaults = default_qspecs(observation)
    assert defaults.input_qspecs[0] == observed_int8()
    quantizer = BoundaryQuantizer(vgf_base(), **defaults.kwargs())
    calls: list[tuple[int, int]] = []
    converted = quantize(
        graph,
        samples[0],
        quantizer,
        calibration=samples,
        on_sample=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    (sampler,) = grid_sample_nodes(converted)
    grid, image = sampler.args[1], sampler.args[0]
    assert isinstance(grid, Node) and isinstance(image, Node)
    assert is_dequantize(grid) and qparams_of(grid) == (
        f32(2 / 32767),
        0,
        -32767,
        32767,
        torch.int16,
    )
    # the observed input covers every sample, sample 2's -3 included: MinMax over all of them
    scale, zero_point, quant_min, quant_max, dtype = qparams_of(image)
    assert (quant_min, quant_max, dtype) == (-127, 127, torch.int8)
    low = float(min(s[0].min() for s in samples))
    high = float(max(s[0].max() for s in samples))
    assert low == -3.0
    assert scale == pytest.approx((high - low) / 254, rel=1e-5)
    assert (quant_min - zero_point) * scale == pytest.approx(low, abs=scale)
    assert len(call_nodes(converted, is_dequantize)) >= 3


class _Requantized(torch.nn.Module):
    """x * 3 quantized with SNORM8's parameters (clips), x quantized with wide ones (does not)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ops = torch.ops.quantized_decomposed
        wide = ops.quantize_per_tensor.default(x + 0, 4 / 127, 0, -127, 127, torch.int8)
        narrow = ops.quantize_per_tensor.default(x * 3, 1 / 127, 0, -127, 127, torch.int8)
        return (
            ops.dequantize_per_tensor.default(wide, 4 / 127, 0, -127, 127, torch.int8),
            ops.dequantize_per_tensor.default(narrow, 1 / 127, 0, -127, 127, torch.int8),
        )


def test_clipping_report_counts_clamped_values_inside_the_graph() -> None:
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers quantized_decomposed)

    from etkit_quant import clipping_report

    samples = [(torch.linspace(-1, 1, 201).view(1, 1, 1, 201),)]
    module = torch.export.export(_Requantized(), samples[0]).module(check_guards=False)
    (record,) = clipping_report(module, samples)
    assert record.name.startswith("tensor mul")
    # x * 3 > 1 + half a step (1/254) for |x| > (1 + 1/254) / 3
    expected = int(((samples[0][0] * 3).abs() > 1 + 1 / 254).sum())
    assert record.count == expected and record.total == 201 and not record.passes()
    assert (record.low, record.high) == pytest.approx((-1.0, 1.0))
    assert clipping_report(module, samples, fixed=[snorm8()])[0].count == expected
    assert clipping_report(module, samples, fixed=[snorm16()]) == ()  # not a fixed range used


class _ClampedAfter(torch.nn.Module):
    """x * 3 quantized with SNORM8's parameters, then clamped by the model to ``bound``."""

    def __init__(self, bound: float) -> None:
        super().__init__()
        self.bound = bound

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.quantized_decomposed
        narrow = ops.quantize_per_tensor.default(x * 3, 1 / 127, 0, -127, 127, torch.int8)
        value = ops.dequantize_per_tensor.default(narrow, 1 / 127, 0, -127, 127, torch.int8)
        return torch.clamp(value, -self.bound, self.bound)


@pytest.mark.parametrize(("bound", "reported"), [(1.0, False), (0.5, False), (2.0, True)])
def test_a_clamp_the_model_applies_anyway_is_not_clipping(bound: float, reported: bool) -> None:
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers quantized_decomposed)

    from etkit_quant import clipping_report

    samples = [(torch.linspace(-1, 1, 201).view(1, 1, 1, 201),)]
    module = torch.export.export(_ClampedAfter(bound), samples[0]).module(check_guards=False)
    assert bool(clipping_report(module, samples)) == reported


def test_samples_of_several_sizes_are_each_checked_against_their_own_reference() -> None:
    """``reference_for`` (a model exported for several sizes): each sample is checked against
    the reference it names, the error naming the sample by its place in the whole list; what it
    raises for a size it refuses reaches the caller as it is."""
    small = (torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, 4, 2))

    def reference_for(index: int, sample: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if sample[0].shape[-1] == 5:
            raise ValueError(f"calibration sample {index} is of a size the model does not take")
        return small if sample[0].shape[-1] == 4 else EXAMPLE

    assert check_calibration([EXAMPLE, small], EXAMPLE, reference_for=reference_for) == [
        EXAMPLE,
        small,
    ]
    wrong = (torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, 8, 2))
    with pytest.raises(ValueError, match=r"sample 2, input 1 has shape \[1, 4, 8, 2\], but the "):
        check_calibration([EXAMPLE, small, wrong], EXAMPLE, reference_for=reference_for)
    with pytest.raises(ValueError, match="sample 1 is of a size the model does not take"):
        check_calibration([small, (torch.zeros(1, 3, 4, 5), small[1])], EXAMPLE,
                          reference_for=reference_for)  # fmt: skip
    with pytest.raises(ValueError, match="sample 0 has 1 inputs, but the model takes 2"):
        check_calibration([small[:1]], EXAMPLE, reference_for=reference_for)


def test_a_graph_of_dynamic_sizes_is_observed_and_calibrated_at_several_sizes() -> None:
    """Captured with a dynamic height and width, a graph takes samples of any size in them
    (its symbolic dimensions take any size; the others are still checked)."""
    dims = [torch.export.Dim(name, min=2, max=16) for name in ("h", "w", "gh", "gw")]
    shapes = ({2: dims[0], 3: dims[1]}, {1: dims[2], 2: dims[3]})
    graph = torch.export.export(Warp().eval(), EXAMPLE, dynamic_shapes=shapes, strict=True)
    samples = [EXAMPLE, (rand(1, 3, 4, 6), rand(1, 4, 6, 2) * 3)]
    observation = observe_ranges(graph, samples)
    grid = observation.inputs[1]
    assert grid.count == EXAMPLE[1].numel() + samples[1][1].numel()
    assert grid.max == max(float(s[1].max()) for s in samples)
    with pytest.raises(ValueError, match=r"sample 1, input 0 has shape \[1, 4, 4, 6\]"):
        observe_ranges(graph, [EXAMPLE, (rand(1, 4, 4, 6), samples[1][1])])
    quantizer = BoundaryQuantizer(vgf_base(), input_qspecs=(snorm8(), None), output_qspecs=(None,))
    converted = quantize(Warp(), EXAMPLE, quantizer, calibration=samples, dynamic_shapes=shapes)
    assert converted(*samples[1]).shape == (1, 3, 4, 6)
