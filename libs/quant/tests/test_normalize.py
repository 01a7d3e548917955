"""``normalize_program``: each step removes the pattern it is about and changes no value of the
float model (exact equality); each upstream bug it works around still reproduces without it (a
pin: when one of these tests fails, upstream changed, and the step may go)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from etkit_quant.graph import target_name
from etkit_quant.normalize import MAX_FOLDED_ELEMENTS, normalize_program


def _ops(program: torch.export.ExportedProgram) -> list[str]:
    return [target_name(n) for n in program.graph.nodes if n.op == "call_function"]


def _normalized(
    model: torch.nn.Module, *inputs: torch.Tensor
) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram, list[str]]:
    exported = torch.export.export(model.eval(), inputs, strict=True)
    normalized, report = normalize_program(exported, inputs)
    for sample in (inputs, tuple(torch.randn_like(x) for x in inputs)):
        expected = model(*sample)
        actual = normalized.module()(*sample)
        assert torch.equal(actual, expected), (actual - expected).abs().max()
    return exported, normalized, [step for step, count in report.steps.items() if count]


class FixedAffineWarp(torch.nn.Module):
    """kornia's shape: a fixed matrix inverted element by element into a fresh 3x3 tensor
    (in-place writes), a ``.to()`` that changes nothing, the grid built from it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("matrix", torch.tensor([[0.9, -0.1, 0.2], [0.1, 1.1, -0.3]]))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        full = torch.eye(3)
        full[:2] = self.matrix  # copy_
        full[2, 2] += 0.0  # add_
        inverse = torch.linalg.inv(full).to(image.dtype)  # _assert_tensor_metadata + to
        theta = inverse[:2].unsqueeze(0)
        grid = F.affine_grid(theta, [1, 3, 6, 8], align_corners=False)
        return F.grid_sample(image, grid, align_corners=False)


def test_in_place_ops_asserts_and_constant_grid_math_fold_into_one_grid() -> None:
    exported, normalized, steps = _normalized(FixedAffineWarp(), torch.rand(1, 3, 6, 8))
    before = _ops(exported)
    assert "aten::copy_" in before and "aten::_assert_tensor_metadata" in before
    assert _ops(normalized) == ["aten::grid_sampler"]
    assert steps == ["functionalize", "drop_metadata_asserts", "fold_constants"]


class PixelMapWarp(torch.nn.Module):
    """kornia's pixel-map normalization: 2 / (W - 1) as 0-dim tensors from ``scalar_tensor``,
    tested with ``eq.Scalar`` and stacked, applied to maps that are inputs."""

    def forward(self, image: torch.Tensor, map_x: torch.Tensor) -> torch.Tensor:
        width = torch.scalar_tensor(8.0)
        factor = torch.where(width == 1, torch.ones(()), 2.0 / (width - 1.0))
        grid_x = map_x * factor - 1.0
        grid = torch.stack([grid_x, grid_x.flip(-2)], -1)
        return F.grid_sample(image, grid, align_corners=True)


def test_constant_factor_folds_and_keeps_the_input_arithmetic() -> None:
    image, map_x = torch.rand(1, 3, 6, 8), torch.rand(1, 6, 8) * 7
    exported, normalized, steps = _normalized(PixelMapWarp(), image, map_x)
    assert "aten::scalar_tensor" in _ops(exported)
    ops = _ops(normalized)
    assert "aten::scalar_tensor" not in ops and "aten::where" not in ops
    assert "aten::mul.Tensor" in ops and "aten::grid_sampler" in ops
    assert "fold_constants" in steps


def test_folded_zero_dim_constant_gets_the_rank_of_its_partner() -> None:
    image, map_x = torch.rand(1, 3, 6, 8), torch.rand(1, 6, 8) * 7
    _, normalized, steps = _normalized(PixelMapWarp(), image, map_x)
    assert "ranked_scalar_constants" in steps
    mul = next(n for n in normalized.graph.nodes if target_name(n) == "aten::mul.Tensor")
    shapes = [tuple(a.meta["val"].shape) for a in mul.args if isinstance(a, torch.fx.Node)]
    assert shapes == [(1, 6, 8), (1, 1, 1)]


class ZeroDimScalarOps(torch.nn.Module):
    """Scalar ops on a 0-dim tensor computed from an input (not foldable)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.sum()
        flag = torch.where(total == 1, total, total + 2.0)  # eq.Scalar on a 0-dim tensor
        return torch.stack([flag, total]) * x.mean()


def test_scalar_ops_on_zero_dim_tensors_become_tensor_ops() -> None:
    exported, normalized, steps = _normalized(ZeroDimScalarOps(), torch.rand(2, 3))
    assert "aten::eq.Scalar" in _ops(exported)
    assert "aten::eq.Scalar" not in _ops(normalized) and "aten::eq.Tensor" in _ops(normalized)
    assert "tensor_scalars" in steps


class HandWritten(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(self.conv(image) * 0.5, grid, align_corners=False)


def test_hand_written_graph_is_returned_as_it_is() -> None:
    inputs = (torch.rand(1, 3, 6, 8), torch.rand(1, 4, 5, 2) * 2 - 1)
    exported = torch.export.export(HandWritten().eval(), inputs, strict=True)
    normalized, report = normalize_program(exported, inputs)
    assert normalized is exported and not report.changed
    assert report.summary() == "nothing to normalize"


class RandomNoise(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(4)


def test_random_ops_are_never_folded() -> None:
    inputs = (torch.rand(2, 4),)
    exported = torch.export.export(RandomNoise(), inputs, strict=True)
    normalized, _ = normalize_program(exported, inputs)
    assert "aten::rand" in _ops(normalized)


class HugeConstant(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(MAX_FOLDED_ELEMENTS + 1).sum()


def test_results_past_the_size_limit_stay_computed() -> None:
    inputs = (torch.rand(2, 4),)
    exported = torch.export.export(HugeConstant(), inputs, strict=True)
    normalized, report = normalize_program(exported, inputs)
    # the sum (one value) folds; the ones it reads are never kept as a constant
    assert "aten::ones" not in _ops(normalized)
    assert all(b.numel() <= MAX_FOLDED_ELEMENTS for b in normalized.constants.values())
    assert report.steps["fold_constants"] == 1


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="ExportedProgram"):
        normalize_program(torch.nn.Identity(), (torch.rand(1),))  # type: ignore[arg-type]
    exported = torch.export.export(torch.nn.ReLU(), (torch.rand(2),), strict=True)
    with pytest.raises(TypeError, match="tuple of tensors"):
        normalize_program(exported, [torch.rand(2)])  # type: ignore[arg-type]


# -- upstream bugs the steps work around: each must still reproduce without them ---------------


class ZeroDimConstantMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.relu(x) * torch.scalar_tensor(0.25)  # kornia's factors


def _causes(error: BaseException) -> str:
    """Every message in ``error``'s chain of causes."""
    messages = []
    current: BaseException | None = error
    while current is not None:
        messages.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(messages)


def _xnnpack_lower(
    program: torch.export.ExportedProgram, inputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock XNNPACK flow on ``program``: the quantized PT2E model's output and the
    lowered program's, run by ExecuTorch's runtime."""
    import tempfile
    from pathlib import Path

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    reference = convert_pt2e(prepared)
    converted = torch.export.export(reference, inputs, strict=True)
    lowered = to_edge_transform_and_lower(converted, partitioner=[XnnpackPartitioner()])
    from executorch.runtime import Runtime

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.pte"
        path.write_bytes(lowered.to_executorch().buffer)
        method = Runtime.get().load_program(path).load_method("forward")
        out = method.execute(list(inputs))[0]
    return reference(*inputs), out


@pytest.mark.slow
def test_upstream_xnnpack_fails_on_a_quantized_zero_dim_constant() -> None:
    """ExecuTorch 1.5.1's ``ChannelsLastTaggedReshapePass`` indexes the first dimension of every
    quantized placeholder (``meta["val"][0]``): a 0-dim constant, quantized by the XNNPACK
    quantizer as a ``mul`` operand, fails the whole lowering. ``ranked_scalar_constants``
    gives it shape [1, ...]: then it lowers."""
    inputs = (torch.rand(1, 3, 4, 4),)
    exported = torch.export.export(ZeroDimConstantMul().eval(), inputs, strict=True)
    with pytest.raises(Exception, match="ChannelsLastTaggedReshapePass") as caught:
        _xnnpack_lower(exported, inputs)
    assert "IndexError: invalid index of a 0-dim tensor" in _causes(caught.value)
    normalized, report = normalize_program(exported, inputs)
    assert report.steps["ranked_scalar_constants"] == 1
    _xnnpack_lower(normalized, inputs)


class InPlaceReluNet(torch.nn.Module):
    """The PyTorch STN tutorial's localization net: conv, max-pool, ``ReLU(True)``, twice."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 7),
            torch.nn.MaxPool2d(2),
            torch.nn.ReLU(True),
            torch.nn.Conv2d(8, 10, 5),
            torch.nn.MaxPool2d(2),
            torch.nn.ReLU(True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.slow
def test_upstream_xnnpack_misreads_an_unannotated_in_place_relu() -> None:
    """ExecuTorch 1.5.1's XNNPACK quantizer leaves ``relu_`` unannotated: its input and output
    get different quantization parameters, and XNNPACK's int8 clamp reads one as the other (over
    half the output's range off the quantized model). ``functional_activations`` gives it the
    ``relu`` the quantizer shares parameters across: then the program matches the model."""
    torch.manual_seed(0)
    inputs = (torch.randn(2, 1, 28, 28),)
    exported = torch.export.export(InPlaceReluNet().eval(), inputs, strict=True)
    reference, out = _xnnpack_lower(exported, inputs)
    assert (out - reference).abs().max() > 0.25 * reference.abs().max()
    normalized, report = normalize_program(exported, inputs)
    assert report.steps["functional_activations"] == 2
    reference, out = _xnnpack_lower(normalized, inputs)
    assert (out - reference).abs().max() < 1e-6


@pytest.mark.slow
def test_upstream_arm_quantizer_widens_scalars_of_zero_dim_tensors() -> None:
    """ExecuTorch 1.5.1's Arm ``ReplaceScalarWithTensorByProfilePass`` (run by
    ``VgfQuantizer.transform_for_annotation``) replaces the scalar of ``eq.Scalar(t, 1)`` by a
    tensor of shape [1]: on a 0-dim ``t`` the result becomes [1], and a ``stack`` of it with a
    0-dim tensor fails ("stack expects each tensor to be equal size"). ``tensor_scalars`` gives
    such ops a 0-dim tensor operand instead: then the pass runs."""
    from executorch.backends.arm.quantizer import (
        VgfQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.backends.arm.vgf import VgfCompileSpec

    def transform(program: torch.export.ExportedProgram) -> None:
        quantizer = VgfQuantizer(VgfCompileSpec("TOSA-1.0+INT+FP+int16"))
        quantizer.set_global(get_symmetric_quantization_config())
        quantizer.transform_for_annotation(program.module(check_guards=False))

    inputs = (torch.rand(2, 3),)
    exported = torch.export.export(ZeroDimScalarOps(), inputs, strict=True)
    with pytest.raises(Exception, match="ReplaceScalarWithTensorByProfilePass") as caught:
        transform(exported)
    assert "stack expects each tensor to be equal size" in _causes(caught.value)
    normalized, _ = normalize_program(exported, inputs)
    transform(normalized)


class InPlaceActivation(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(F.relu(self.norm(self.conv(image)), inplace=True), grid)


def test_an_in_place_activation_takes_its_functional_form_and_nothing_else_changes() -> None:
    """A hand-written ``relu(inplace=True)`` becomes ``relu`` (the quantizers' patterns name
    the functional op; XNNPACK's quantizer leaves ``relu_`` unannotated), without the whole
    graph's functionalization (which would turn ``batch_norm`` into
    ``_native_batch_norm_legit_no_training``)."""
    inputs = (torch.rand(1, 3, 6, 8), torch.rand(1, 4, 5, 2) * 2 - 1)
    model = InPlaceActivation().eval()
    exported = torch.export.export(model, inputs, strict=True)
    assert "aten::relu_" in _ops(exported)
    normalized, report = normalize_program(exported, inputs)
    ops = _ops(normalized)
    assert "aten::relu_" not in ops and "aten::relu" in ops
    assert "aten::batch_norm" in ops and "aten::_native_batch_norm_legit_no_training" not in ops
    assert report.steps["functional_activations"] == 1 and report.steps["functionalize"] == 0
    with torch.no_grad():
        assert torch.equal(normalized.module()(*inputs), model(*inputs))


class _NoopViews(torch.nn.Module):
    """A whole-tensor slice (recorded as ``alias``), a clone and a same-shape view of a resized
    tensor, and a real slice and reshape beside them."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.interpolate(x, size=(4, 7), mode="nearest")
        whole = y[:, 0:2]
        return y - whole, y * y.clone(), y.view(1, 2, 4, 7) + 1, y[:, 0:1], y.reshape(1, 4, 14)


def test_views_that_change_nothing_are_bypassed_and_the_values_kept() -> None:
    x = torch.rand(1, 2, 9, 15, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(_NoopViews(), (x,), strict=True)
    normalized, report = normalize_program(program, (x,))
    names = [target_name(n) for n in normalized.graph.nodes if n.op == "call_function"]
    assert "aten::alias" not in names and "aten::clone" not in names
    assert names.count("aten::view") == 0  # the same-shape view; the reshape keeps its own
    assert "aten::slice.Tensor" in names and "aten::reshape" in names
    assert report.steps["drop_noop_views"] == 3
    with torch.no_grad():
        for a, b in zip(normalized.module()(x), _NoopViews()(x), strict=True):
            assert torch.equal(a, b)


class _Twins(torch.nn.Module):
    """``sigmoid(x)`` computed twice, a pad of nothing, and two random draws."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        same = F.pad(x, (0, 0, 0, 0), mode="reflect")
        noise = torch.rand(1) - torch.rand(1)  # two draws: never one
        return torch.sigmoid(same) + noise, torch.sigmoid(x) * 2


def test_twin_computations_merge_pads_of_nothing_go_and_random_draws_stay() -> None:
    x = torch.rand(1, 2, 5, 6, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(_Twins(), (x,), strict=True)
    normalized, report = normalize_program(program, (x,))
    before, after = _ops(program), _ops(normalized)
    assert before.count("aten::sigmoid") == 2 and after.count("aten::sigmoid") == 1
    assert not any("pad" in name for name in after)
    assert after.count("aten::rand") == 2
    assert report.steps["merge_duplicates"] == 1 and report.steps["drop_noop_views"] == 1
    torch.manual_seed(3)
    expected = _Twins()(x)
    torch.manual_seed(3)
    for a, b in zip(normalized.module()(x), expected, strict=True):
        assert torch.equal(a, b)


class _TwinGrids(torch.nn.Module):
    """RIFE's ``warp()`` twice on one flow: each call builds its own base grid (two equal
    constants) and adds the same flow to it; a third sum adds a different constant."""

    def forward(self, flow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def base() -> torch.Tensor:
            return torch.linspace(-1.0, 1.0, 6).view(1, 1, 1, 6).expand(1, 2, 5, 6)

        other = torch.linspace(-1.0, 0.5, 6).view(1, 1, 1, 6).expand(1, 2, 5, 6)
        return (base() + flow) * 2, (base() + flow) * 2, other + flow


def test_twins_reading_equal_constants_merge_and_each_constant_keeps_one_use() -> None:
    flow = torch.rand(1, 2, 5, 6, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(_TwinGrids(), (flow,), strict=True)
    normalized, report = normalize_program(program, (flow,))
    after = _ops(normalized)
    assert after.count("aten::add.Tensor") == 2  # the twins' sum once, the other constant's
    assert after.count("aten::mul.Tensor") == 1
    assert report.steps["merge_duplicates"] == 2
    module = normalized.module()
    constants = [n for n in module.graph.nodes if n.op == "get_attr"]
    assert len(constants) == 2 and all(len(n.users) == 1 for n in constants)
    outputs = module(flow)
    for a, b in zip(outputs, _TwinGrids()(flow), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(outputs[0] / 2, outputs[2])


class _SlicesOfCat(torch.nn.Module):
    """Slices of a ``cat`` of a 1-channel and a 3-channel tensor: all of the second input
    (``[:, 1:4]``), part of it (``[:, -2:]``), across both (``[:, 0:2]``), and along another
    dimension (``[:, :, 1:]``)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        joined = torch.cat([torch.tanh(a), torch.sigmoid(b)], 1)
        return joined[:, 1:4] * 2, joined[:, -2:] + 1, joined[:, 0:2] - 1, joined[:, :, 1:] * 3


def test_slices_within_one_input_of_a_cat_read_that_input() -> None:
    a = torch.rand(1, 1, 4, 5, generator=torch.Generator().manual_seed(0))
    b = torch.rand(1, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    program = torch.export.export(_SlicesOfCat(), (a, b), strict=True)
    normalized, report = normalize_program(program, (a, b))
    assert report.steps["slices_of_cat"] == 2  # the whole input and the part; not the others
    slices = [n for n in normalized.graph.nodes if target_name(n) == "aten::slice.Tensor"]
    from_cat = [n for n in slices if target_name(n.args[0]) == "aten::cat"]
    assert len(from_cat) == 2, [n.format_node() for n in slices]  # across, other dimension
    assert any(target_name(n.args[0]) == "aten::sigmoid" for n in slices)  # the part
    for x, y in ((a, b), (torch.randn_like(a), torch.randn_like(b))):
        for actual, expected in zip(normalized.module()(x, y), _SlicesOfCat()(x, y), strict=True):
            assert torch.equal(actual, expected)


class _SampledThenSlicedAway(torch.nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(x[:, :1], grid, mode="nearest", align_corners=True)
        return torch.cat([warped, torch.relu(x)], 1)[:, 1:]


def test_a_cat_sliced_to_one_input_leaves_the_graph_with_its_other_inputs() -> None:
    x = torch.rand(1, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    grid = torch.rand(1, 4, 5, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    _, normalized, steps = _normalized(_SampledThenSlicedAway(), x, grid)
    assert "slices_of_cat" in steps
    after = _ops(normalized)
    assert "aten::cat" not in after and not any("grid_sampler" in op for op in after), after


class _AdaptiveMaxPools(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tiles = F.adaptive_max_pool2d(x, (4, 2))  # 16 x 10 -> 4 x 2: tiles of 4 x 5
        pooled, where = F.adaptive_max_pool2d(torch.relu(x), 2, return_indices=True)
        uneven = F.adaptive_max_pool2d(x, (3, 3))  # 16 x 10 -> 3 x 3: windows of two sizes
        return tiles, pooled, where, uneven


def test_adaptive_max_pools_over_whole_tiles_become_max_pools() -> None:
    x = torch.randn(2, 3, 16, 10, generator=torch.Generator().manual_seed(0))
    exported = torch.export.export(_AdaptiveMaxPools(), (x,), strict=True)
    normalized, report = normalize_program(exported, (x,))
    assert [step for step, count in report.steps.items() if count] == ["adaptive_max_pools"]
    for sample in (x, torch.randn_like(x)):
        got = normalized.module()(sample)
        for actual, expected in zip(got, _AdaptiveMaxPools()(sample), strict=True):
            assert torch.equal(actual, expected)  # the values, and the indices
    assert _ops(exported).count("aten::adaptive_max_pool2d") == 3
    after = _ops(normalized)
    # the tiles: max_pool2d, which the quantizers annotate; the pool whose indices are read:
    # max_pool2d_with_indices; the uneven one stays (no max_pool2d computes it)
    assert after.count("aten::max_pool2d") == 1, after
    assert after.count("aten::max_pool2d_with_indices") == 1, after
    assert after.count("aten::adaptive_max_pool2d") == 1, after
    pool = next(n for n in normalized.graph.nodes if target_name(n) == "aten::max_pool2d")
    assert list(pool.args[1:3]) == [[4, 5], [4, 5]]


class DeadBranch(torch.nn.Module):
    """A warp computed and dropped (a debugging leftover): ``torch.export`` keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        grid = F.affine_grid(theta, [1, 1, 6, 7], align_corners=False)
        _unused = F.grid_sample(x, grid, align_corners=False)
        return self.conv(x)


def test_dead_code_leaves_the_graph() -> None:
    torch.manual_seed(0)
    x, theta = torch.rand(1, 1, 6, 7), torch.tensor([[[1.0, 0.1, 0.0], [0.0, 1.0, 0.1]]])
    exported, normalized, steps = _normalized(DeadBranch(), x, theta)
    assert "aten::grid_sampler" in _ops(exported)  # torch.export keeps it
    assert "drop_dead_code" in steps
    assert not any("grid_sampler" in op or "affine_grid" in op for op in _ops(normalized))
