"""Quantization-aware training: ``prepare_qat`` / ``convert_qat`` on small flow-warp models with
the VGF and XNNPACK bases configured for QAT, and the grid-sampler replacement hook."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from quant_models import FlowWarp, f32, grid_sample_nodes, pixel_grid, qparams_of, rand
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase, FixedQParamsFakeQuantize

from etkit_quant import (
    BoundaryQuantizer,
    QatGraphModule,
    QatGridSampler,
    convert_qat,
    fake_quant_params,
    is_dequantize,
    is_quantize,
    prepare_qat,
    prepared_grid_samplers,
    quantize,
    replace_grid_samplers,
    snorm8,
)

SNORM8 = (f32(1 / 127), 0, -127, 127, torch.int8)
SNORM16 = (f32(1 / 32767), 0, -32767, 32767, torch.int16)
STEP = 1 / 127  # one step of the SNORM8 output
WITHIN_ONE_STEP = 1 + 1e-3  # (a difference of one step, measured in float32)
SIZE = 16


def vgf_quantizer(is_qat: bool = True) -> BoundaryQuantizer:
    base = VgfQuantizer(VgfCompileSpec())
    base.set_global(get_symmetric_quantization_config(is_qat=is_qat))
    return BoundaryQuantizer(base, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),))


def xnnpack_quantizer() -> BoundaryQuantizer:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        get_symmetric_quantization_config as xnnpack_config,
    )

    base = XNNPACKQuantizer().set_global(xnnpack_config(is_qat=True))
    return BoundaryQuantizer(base, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),))


def frames(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(rand(1, 3, SIZE, SIZE), rand(1, 3, SIZE, SIZE)) for _ in range(count)]


class BatchNormWarp(torch.nn.Module):
    """conv + batch norm + relu predicts a flow (in pixels-ish units) that warps frame 0."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(6, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.flow = torch.nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.norm(self.features(torch.cat([frame0, frame1], 1))))
        flow = self.flow(features).permute(0, 2, 3, 1) * 0.1
        return F.grid_sample(frame0, pixel_grid(SIZE, SIZE) + flow, align_corners=False)


class SharedEncoderWarp(torch.nn.Module):
    """One encoder applied to both frames (XNNPACK's quantizer annotates only its first use)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.flow = torch.nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        features = torch.cat([self.encoder(frame0), self.encoder(frame1)], 1)
        flow = self.flow(features).permute(0, 2, 3, 1) * 0.1
        return F.grid_sample(frame0, pixel_grid(SIZE, SIZE) + flow, align_corners=False)


class NoParameters(torch.nn.Module):
    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(image, grid, align_corners=False)


def target_of(sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """What the warp should learn: frame 0 moved right by a quarter of a pixel step."""
    grid = pixel_grid(SIZE, SIZE) + torch.tensor([0.5 / SIZE, 0.0])
    return F.grid_sample(sample[0], grid, padding_mode="border", align_corners=False)


def train(
    prepared: GraphModule,
    samples: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    loss_of: Callable[[torch.Tensor, tuple[torch.Tensor, torch.Tensor]], torch.Tensor],
) -> list[float]:
    prepared.train()
    optimizer = torch.optim.Adam(prepared.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = sum((loss_of(prepared(*s), s) for s in samples), torch.zeros(()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def fake_quant_state(prepared: GraphModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {
        name: (m.scale.detach().clone(), m.zero_point.detach().clone())
        for name, m in prepared.named_modules()
        if isinstance(m, FakeQuantizeBase) and hasattr(m, "scale")
    }


def steps_apart(
    prepared: GraphModule,
    converted: GraphModule,
    samples: list[tuple[torch.Tensor, torch.Tensor]],
) -> float:
    """The largest difference between the prepared module's eval forward and the converted
    model's, in SNORM8 output steps."""
    prepared.eval()
    with torch.no_grad():
        return max(float((prepared(*s) - converted(*s)).abs().max()) / STEP for s in samples)


def quantize_params(converted: GraphModule) -> list[tuple[float, int, int, int, torch.dtype]]:
    return [qparams_of(n) for n in converted.graph.nodes if is_quantize(n)]


def sampler_params(converted: GraphModule) -> list[tuple[object, ...]]:
    """Each grid sampler's image and grid dequantize parameters and its output quantize's."""
    result: list[tuple[object, ...]] = []
    for sampler in grid_sample_nodes(converted):
        image, grid = sampler.args[0], sampler.args[1]
        assert isinstance(image, Node) and isinstance(grid, Node)
        assert is_dequantize(image) and is_dequantize(grid)
        (output,) = sampler.users
        assert is_quantize(output)
        result.append((qparams_of(image), qparams_of(grid), qparams_of(output)))
    return result


@pytest.fixture(scope="module")
def flow_warp() -> tuple[FlowWarp, list[tuple[torch.Tensor, torch.Tensor]], GraphModule]:
    """A FlowWarp, its calibration samples and the module prepare_qat returned for VGF (tests
    take copies)."""
    torch.manual_seed(1)
    model = FlowWarp()
    samples = frames(4)
    prepared = prepare_qat(model, samples[0], vgf_quantizer(), calibration=samples)
    return model, samples, prepared


def test_trains_fixed_ranges_stay_learnt_move_and_converts_within_a_step(
    flow_warp: tuple[FlowWarp, list[tuple[torch.Tensor, torch.Tensor]], GraphModule],
) -> None:
    model, samples, original = flow_warp
    prepared = copy.deepcopy(original)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert prepared.training
    initial = fake_quant_state(prepared)
    modules = dict(prepared.named_modules())
    fixed = {n for n in initial if isinstance(modules[n], FixedQParamsFakeQuantize)}
    learnt = set(initial) - fixed
    # SNORM8 frames and output, the sampler's SNORM8 image and output, its int16 grid.
    assert len(fixed) >= 4 and learnt

    losses = train(prepared, samples, 12, lambda out, s: F.mse_loss(out, target_of(s)))
    assert losses[-1] < 0.8 * losses[0], losses

    after = fake_quant_state(prepared)
    for name in fixed:
        assert torch.equal(after[name][0], initial[name][0]), name
        assert torch.equal(after[name][1], initial[name][1]), name
    moved = [n for n in learnt if not torch.equal(after[n][0], initial[n][0])]
    assert moved, "no learnt range moved while training"
    for name, value in model.state_dict().items():  # the caller's model trained nothing
        assert torch.equal(value, before[name]), name

    # eval stops observation: an eval forward on new data leaves every range as it is.
    assert prepared.eval() is prepared and not prepared.training
    at_eval = fake_quant_state(prepared)
    with torch.no_grad():
        prepared(rand(1, 3, SIZE, SIZE, low=-3, high=3), rand(1, 3, SIZE, SIZE))
    frozen = fake_quant_state(prepared)
    assert all(torch.equal(frozen[n][0], at_eval[n][0]) for n in at_eval)

    converted = convert_qat(prepared)
    apart = steps_apart(prepared, converted, [*samples, *frames(4)])
    # Measured: 1 step at 1 of the 6144 output values, 0 elsewhere. The program takes the
    # parameters the fake quantizes hold; the conv biases, float in training (as upstream's
    # QAT leaves them), are int32 in the program: conv outputs differ by up to 5e-6, which
    # tips one rounding.
    assert apart <= WITHIN_ONE_STEP, f"{apart} steps"
    assert isinstance(prepared, QatGraphModule) and not isinstance(converted, QatGraphModule)
    assert isinstance(copy.deepcopy(prepared), QatGraphModule)  # train/eval survive a copy
    # The prepared module is left as it was: it trains on after a convert.
    assert prepared.train() is prepared and prepared.training
    train(prepared, samples[:1], 1, lambda out, s: F.mse_loss(out, target_of(s)))


def test_annotations_are_the_ptq_paths(
    flow_warp: tuple[FlowWarp, list[tuple[torch.Tensor, torch.Tensor]], GraphModule],
) -> None:
    model, samples, original = flow_warp
    qat = convert_qat(copy.deepcopy(original))
    ptq = quantize(model.eval(), samples[0], vgf_quantizer(is_qat=False), calibration=samples)
    # The grid sampler reads an int8 SNORM image and an int16 SNORM16 grid and writes SNORM8.
    assert sampler_params(qat) == sampler_params(ptq) == [(SNORM8, SNORM16, SNORM8)]
    qat_params, ptq_params = quantize_params(qat), quantize_params(ptq)
    assert len(qat_params) == len(ptq_params)
    fixed_scales = {SNORM8[0], SNORM16[0]}
    for q, p in zip(qat_params, ptq_params, strict=True):
        assert q[2:] == p[2:]  # range and dtype
        if p[0] in fixed_scales:  # a fixed preset: the same parameters exactly
            assert q == p
    assert qat_params[0] == qat_params[1] == SNORM8  # both frames SNORM8
    assert qat_params[-1] == SNORM8  # the output SNORM8


def test_grid_sampler_hook(
    flow_warp: tuple[FlowWarp, list[tuple[torch.Tensor, torch.Tensor]], GraphModule],
) -> None:
    _, samples, original = flow_warp
    plain = copy.deepcopy(original)
    (site,) = prepared_grid_samplers(plain)
    assert (site.mode, site.padding_mode, site.align_corners) == ("bilinear", "border", False)
    assert site.replacement is None
    assert site.image is not None and site.grid is not None and site.output is not None
    image, grid, output = (fake_quant_params(fq) for fq in (site.image, site.grid, site.output))
    assert (image.scale, image.dtype, image.quant_min) == (SNORM8[0], torch.int8, -127)
    assert (grid.scale, grid.dtype, grid.quant_max) == (SNORM16[0], torch.int16, 32767)
    assert (output.scale, output.dtype) == (SNORM8[0], torch.int8)

    class Sampler(torch.nn.Module):
        """A trivial replacement: PyTorch's sampler with the site's settings, counted."""

        def __init__(self, site: QatGridSampler) -> None:
            super().__init__()
            self.settings = (site.mode, site.padding_mode, site.align_corners)
            self.calls = 0

        def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            mode, padding_mode, align_corners = self.settings
            return F.grid_sample(
                image, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
            )

    made: list[Sampler] = []

    def replacement(site: QatGridSampler) -> torch.nn.Module:
        made.append(Sampler(site))
        return made[-1]

    replaced = copy.deepcopy(original)
    assert replace_grid_samplers(replaced, replacement) == [site.name]
    assert replace_grid_samplers(replaced, replacement) == []  # replaced once
    (after,) = prepared_grid_samplers(replaced)
    assert after.name == site.name and after.replacement is not None
    assert after.node.op == "call_module" and after.mode == "bilinear"
    assert fake_quant_params(after.grid) == grid  # type: ignore[arg-type]

    sample = samples[0]
    assert torch.equal(replaced(*sample), plain(*sample))
    assert made[0].calls == 1
    loss = F.mse_loss(replaced(*sample), target_of(sample))
    loss.backward()
    flow_weight = next(p for n, p in replaced.named_parameters() if p.shape[:2] == (2, 6))
    assert flow_weight.grad is not None and bool(flow_weight.grad.abs().sum() > 0)

    # convert puts PyTorch's sampler back, between the same quantizes. (Each train forward
    # moves the observed ranges, a moving average: plain takes those replaced's second forward
    # moved, and its weights, which no step changed.)
    plain.load_state_dict(replaced.state_dict())
    converted, reference = convert_qat(replaced), convert_qat(plain)
    assert len(grid_sample_nodes(converted)) == 1
    assert not any(n.op == "call_module" for n in converted.graph.nodes)
    assert sampler_params(converted) == sampler_params(reference)
    with torch.no_grad():
        assert torch.equal(converted(*sample), reference(*sample))
    with pytest.raises(TypeError, match=r"grid sampler .* must be a torch.nn.Module or None"):
        replace_grid_samplers(copy.deepcopy(original), lambda site: 3)  # type: ignore[arg-type,return-value]


def test_prepare_qat_runs_passes_and_applies_the_replacement() -> None:
    model, samples = FlowWarp(), frames(2)
    seen: list[QatGridSampler] = []

    def replacement(site: QatGridSampler) -> torch.nn.Module | None:
        seen.append(site)
        return None  # keep PyTorch's sampler

    passed: list[GraphModule] = []
    progress: list[tuple[int, int]] = []
    prepared = prepare_qat(
        model,
        samples[0],
        vgf_quantizer(),
        calibration=samples,
        on_sample=lambda done, total: progress.append((done, total)),
        passes=[passed.append],
        sampler_replacement=replacement,
    )
    assert [s.name for s in seen] == [s.name for s in prepared_grid_samplers(prepared)]
    assert len(grid_sample_nodes(prepared)) == 1
    assert len(passed) == 1 and len(grid_sample_nodes(passed[0])) == 1  # before quantizing
    assert not any(n.op == "call_module" for n in passed[0].graph.nodes)
    assert progress == [(1, 2), (2, 2)]


def test_batch_norm_folds_as_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv and its batch norm train with the fold simulated; the converted model folds it,
    torchao's fold matching only conv2d's patterns (``etkit_quant.conv_bn_fold``)."""
    from etkit_quant import conv_bn_fold

    matched: list[str] = []
    helper = conv_bn_fold._original_helper

    def counting(m: GraphModule, conv_fn: Callable[..., object], *args: object) -> GraphModule:
        matched.append(conv_fn.__name__)
        return helper(m, conv_fn, *args)

    monkeypatch.setattr(conv_bn_fold, "_original_helper", counting)
    samples = frames(3)
    prepared = prepare_qat(BatchNormWarp(), samples[0], vgf_quantizer(), calibration=samples)
    (norm,) = [n for n in prepared.graph.nodes if "batch_norm" in str(n.target)]
    assert norm.args[5] is True  # training: batch statistics, running ones updated
    mean = norm.args[3]
    assert isinstance(mean, Node) and mean.op == "get_attr"
    running = prepared.get_submodule("").__getattr__(str(mean.target))
    initial = running.clone()
    train(prepared, samples, 3, lambda out, s: F.mse_loss(out, s[1]))
    assert not torch.equal(running, initial)
    prepared.eval()
    converted = convert_qat(prepared)
    assert not [n for n in converted.graph.nodes if "batch_norm" in str(n.target)]
    assert matched == ["conv2d"]  # the other three conv functions' patterns: not exported
    apart = steps_apart(prepared, converted, samples)
    assert apart <= WITHIN_ONE_STEP, f"{apart} steps"  # measured: 1 (float vs int32 biases)


def test_xnnpack_shared_encoder_trains_once() -> None:
    """XNNPACK: one encoder used twice stays one trained tensor, and the program matches."""
    samples = frames(3)
    prepared = prepare_qat(
        SharedEncoderWarp(), samples[0], xnnpack_quantizer(), calibration=samples
    )
    names = {n for n, _ in prepared.named_parameters(remove_duplicate=False)}
    copies = {n for n in names if "_for_" in n}
    assert copies  # BoundaryQuantizer gave the second use its own copy ...
    for name in copies:  # ... which trains as the encoder's own tensor
        original = name.split("_for_")[0].replace("_", ".", 1)
        assert prepared.get_parameter(name) is prepared.get_parameter(original)
    train(prepared, samples, 3, lambda out, s: F.mse_loss(out, target_of(s)))
    prepared.eval()
    converted = convert_qat(prepared)
    assert sampler_params(converted) == [(SNORM8, SNORM16, SNORM8)]
    apart = steps_apart(prepared, converted, samples)
    assert apart <= WITHIN_ONE_STEP, f"{apart} steps"  # measured: 0


def test_bad_input_one_clear_line() -> None:
    sample = (rand(1, 3, 8, 8), pixel_grid(8, 8))
    one_input = BoundaryQuantizer(
        VgfQuantizer(VgfCompileSpec()).set_global(get_symmetric_quantization_config(is_qat=True)),
        input_qspecs=(snorm8(), None),
        output_qspecs=(snorm8(),),
    )
    with pytest.raises(ValueError, match=r"no parameters to train .*etkit_quant.quantize"):
        prepare_qat(NoParameters(), sample, one_input, calibration=[sample])
    frozen = FlowWarp().requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters to train"):
        prepare_qat(frozen, frames(1)[0], vgf_quantizer(), calibration=frames(1))
    model, inputs = FlowWarp(), frames(1)[0]
    with pytest.raises(TypeError, match="quantizer must be a torchao PT2E Quantizer"):
        prepare_qat(model, inputs, object(), calibration=[inputs])  # type: ignore[arg-type]
    for empty in ([], None, iter(())):
        with pytest.raises(ValueError, match="calibration must give at least one sample"):
            prepare_qat(model, inputs, vgf_quantizer(), calibration=empty)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="calibration must give at least one sample"):
        prepare_qat(model, inputs, vgf_quantizer(), calibration=inputs[0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calibration sample 0, input 1 has shape"):
        prepare_qat(model, inputs, vgf_quantizer(), calibration=[(inputs[0], inputs[0][:, :2])])
    with pytest.raises(TypeError, match="sampler_replacement must be a callable"):
        prepare_qat(model, inputs, vgf_quantizer(), calibration=[inputs], sampler_replacement=1)  # type: ignore[arg-type]
    for not_prepared in (model, torch.fx.symbolic_trace(torch.nn.Conv2d(1, 1, 1))):
        with pytest.raises(
            TypeError, match=r"prepared must be the module etkit_quant\.prepare_qat"
        ):
            convert_qat(not_prepared)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="prepared must be the module"):
            prepared_grid_samplers(not_prepared)  # type: ignore[arg-type]


def test_a_ptq_base_is_refused() -> None:
    inputs = frames(1)[0]
    with pytest.raises(ValueError, match=r"not a fake quantize: configure its base for QAT"):
        prepare_qat(FlowWarp(), inputs, vgf_quantizer(is_qat=False), calibration=[inputs])


def test_observed_range_covers_calibration_then_moves_as_an_average() -> None:
    """The flow's ``observed_int8`` range covers every calibration sample, as ``quantize``'s
    calibration does (the converted model's quantize parameters are the PTQ path's); while
    training it moves 1 % of the way towards each batch's min and max (narrower batches
    shrink it), except that a batch beyond it widens it at once (an outlier widens it for a
    while, not for good)."""
    torch.manual_seed(3)
    model, samples = FlowWarp(), frames(4)
    prepared = prepare_qat(model, samples[0], xnnpack_quantizer(), calibration=samples)
    (observed,) = [
        m
        for m in prepared.modules()
        if isinstance(m, FakeQuantizeBase)
        and not isinstance(m, FixedQParamsFakeQuantize)
        and m.qscheme == torch.per_tensor_affine
        # observed_int8's (the base's own observe a histogram or a plain moving average)
        and type(m.activation_post_process).__name__ == "_CalibratedMovingAverageObserver"
    ]
    observer = observed.activation_post_process
    with torch.no_grad():
        flows = torch.cat([model.flow(torch.cat(s, 1)) for s in samples])
    assert float(observer.min_val) == pytest.approx(float(flows.min()), abs=1e-6)
    assert float(observer.max_val) == pytest.approx(float(flows.max()), abs=1e-6)
    ptq = quantize(model.eval(), samples[0], xnnpack_quantizer(), calibration=samples)
    qat_params, ptq_params = quantize_params(convert_qat(prepared)), quantize_params(ptq)
    assert len(qat_params) == len(ptq_params)
    for q, p in zip(qat_params, ptq_params, strict=True):  # (float rounding: scale 1e-6 apart)
        assert q[2:] == p[2:] and q[0] == pytest.approx(p[0], rel=1e-4), (q, p)
        assert abs(q[1] - p[1]) <= 1, (q, p)

    # Train forwards on frames of a tenth the contrast (a narrower flow): a min/max would stay
    # where calibration left it; the average moves 1 % of the way each time (0.99**200: 13 %
    # of the gap left).
    low, high = float(observer.min_val), float(observer.max_val)
    narrow = (samples[0][0] * 0.1, samples[0][1] * 0.1)
    with torch.no_grad():
        narrow_flow = model.flow(torch.cat(narrow, 1))
        for _ in range(200):
            prepared(*narrow)
    assert float(observer.max_val) < high and float(observer.min_val) > low
    span = float(observer.max_val - observer.min_val)
    narrow_span = float(narrow_flow.max() - narrow_flow.min())
    assert abs(span - narrow_span) < 0.2 * (high - low - narrow_span), (span, narrow_span)
    # A batch beyond the range widens it at once: nothing a training forward sees is clipped.
    # (Fed to the observer itself: the base's fake quantizes before it, plain moving averages,
    # have narrowed too and would clip full-contrast frames now.)
    observer(torch.tensor([low - 1.0, 0.0, high + 2.0]))
    assert float(observer.min_val) == pytest.approx(low - 1.0, abs=1e-6)
    assert float(observer.max_val) == pytest.approx(high + 2.0, abs=1e-6)
    # eval freezes it (the range convert_qat takes).
    prepared.eval()
    held = observed.scale.detach().clone()
    with torch.no_grad():
        prepared(*samples[1])
    assert torch.equal(observed.scale, held)
