"""``requantize_shared_inputs``: every op that backends compute on the integers themselves
reads its inputs in its output's parameters, and the quantized model's values do not change."""

from __future__ import annotations

import importlib
import operator

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
from quant_models import qparams_of
from torch.fx import GraphModule, Node

from etkit_quant import (
    BoundaryQuantizer,
    fixed,
    is_dequantize,
    is_quantize,
    observed_int8,
    quantize,
    snorm8,
)
from etkit_quant.requantize import (
    INTERPOLATING_OPS,
    SHARED_PARAMETER_OPS,
    requantize_shared_inputs,
)


class LookupThenUpdate(torch.nn.Module):
    """RAFT's update step: correlation lookups (one row of values per pixel) reshaped into
    channels, concatenated with the flow (its own fine scale, as a coordinate input or a
    boundary gives it) and context features, then a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(9 + 9 + 2 + 8, 4, 3, padding=1)

    def forward(
        self, s0: torch.Tensor, s1: torch.Tensor, flow: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        n, _, h, w = flow.shape
        lookups = torch.cat([s0.view(n, h, w, -1), s1.view(n, h, w, -1)], dim=-1)
        corr = lookups.permute(0, 3, 1, 2)
        return self.conv(torch.cat([corr, flow, context], 1))


# the module, not the function the package exports under its name
quantize_module = importlib.import_module("etkit_quant.quantize")
FLOW = fixed(0.00293, 0, torch.int8, -127, 127)


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return (
        (torch.rand(64, 1, 3, 3, generator=g) * 2 - 1) * 0.5,
        (torch.rand(64, 1, 3, 3, generator=g) * 2 - 1) * 0.5,
        (torch.rand(1, 2, 8, 8, generator=g) * 2 - 1) * 0.35,
        torch.rand(1, 8, 8, 8, generator=g),
    )


def _base(target: str) -> object:
    if target == "vgf":
        vgf = VgfQuantizer(VgfCompileSpec())
        vgf.set_global(get_symmetric_quantization_config())
        return vgf
    return XNNPACKQuantizer().set_global(xnnpack_config())


def _quantize(target: str, model: torch.nn.Module) -> GraphModule:
    quantizer = BoundaryQuantizer(
        _base(target),  # type: ignore[arg-type]
        input_qspecs=(snorm8(), snorm8(), FLOW, snorm8()),
        output_qspecs=(None,),  # the update computed in float: the cat's output int8 1/127
    )
    return quantize(model, _inputs(), quantizer)


def _mismatches(gm: GraphModule, ops: frozenset[str] = SHARED_PARAMETER_OPS) -> list[str]:
    """Ops of ``ops`` with a dequantized input in other parameters than the quantize of their
    output."""
    found = []
    for node in gm.graph.nodes:
        name = node.target.name() if hasattr(node.target, "name") else ""
        if node.op != "call_function" or name.split(".")[0] not in ops:
            continue
        users = list(node.users)
        if users and all(u.target is operator.getitem for u in users):  # split: its results
            items = [u for u in users if u.meta["val"].dtype.is_floating_point]
            users = [q for item in items for q in item.users]
        if not users or not all(is_quantize(u) for u in users):
            continue
        out = qparams_of(users[0])
        inputs: list[Node] = [a for a in node.all_input_nodes if is_dequantize(a)]
        found += [f"{node.name} reads {a.name}" for a in inputs if qparams_of(a) != out]
    return found


@pytest.mark.parametrize("target", ["vgf", "xnnpack"])
def test_shared_parameter_ops_read_their_inputs_in_their_output_parameters(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow enters the ``cat`` at its own scale (0.00293) while the ``cat`` writes 1/127:
    without the rewrite the graph holds that mismatch (the Arm backend then concatenated the
    integers as they are); with it, none, and the quantized model computes the same values
    exactly."""
    model = LookupThenUpdate().eval()
    monkeypatch.setattr(quantize_module, "requantize_shared_inputs", lambda gm, **_: [])
    before = _quantize(target, model)
    if target == "vgf":  # the XNNPACK quantizer requantizes this cat's inputs itself
        assert any(m.startswith("cat") for m in _mismatches(before)), _mismatches(before)
    monkeypatch.undo()
    after = _quantize(target, model)
    assert _mismatches(after) == []
    with torch.no_grad():
        assert torch.equal(after(*_inputs()), before(*_inputs()))


def test_rewrite_reports_the_ops_and_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize_module, "requantize_shared_inputs", lambda gm, **_: [])
    gm = _quantize("vgf", LookupThenUpdate().eval())
    rewritten = requantize_shared_inputs(gm)
    assert rewritten and all(name.startswith("cat") for name in rewritten), rewritten
    assert requantize_shared_inputs(gm) == []


class WarpCatPad(torch.nn.Module):
    """A sigmoid's output warped and concatenated with itself, then a replicate pad (or a
    clamp) and a bilinear resize to an SNORM8 output: the pad reads SNORM8 and writes the
    sigmoid's parameters (Arm lowers a replicate pad as slices and a concatenation of the
    integers, a clamp with its bounds in one set of parameters)."""

    def __init__(self, tail: str) -> None:
        super().__init__()
        self.tail = tail

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        features = torch.relu(torch.sigmoid(x))
        warped = torch.nn.functional.grid_sample(
            features, grid, mode="nearest", padding_mode="border", align_corners=False
        )
        joined = torch.cat([warped, features], 1)
        if self.tail == "aten::clamp":
            tail = torch.clamp(joined, 0.55, 0.7)
        elif self.tail == "aten::amax":
            tail = torch.max(joined, dim=1, keepdim=True)[0]  # exported as amax
        else:
            tail = torch.nn.functional.pad(joined, (1, 1, 0, 2), mode="replicate")
        return torch.nn.functional.interpolate(
            tail, size=(10, 13), mode="bilinear", align_corners=False
        )


@pytest.mark.parametrize("op", ["aten::pad", "aten::clamp", "aten::amax"])
def test_pad_clamp_and_max_read_their_input_in_their_output_parameters(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(3)
    inputs = (torch.rand(1, 8, 10, 13, generator=g), torch.rand(1, 10, 13, 2, generator=g) * 2 - 1)

    def run() -> GraphModule:
        quantizer = BoundaryQuantizer(
            _base("vgf"),  # type: ignore[arg-type]
            input_qspecs=(snorm8(), None),
            output_qspecs=(snorm8(),),
            grid_sampler_image_from_producer=True,
        )
        return quantize(WarpCatPad(op).eval(), inputs, quantizer)

    monkeypatch.setattr(quantize_module, "requantize_shared_inputs", lambda gm, **_: [])
    ops = frozenset({op})
    before = run()
    assert _mismatches(before, ops), _mismatches(before)
    monkeypatch.undo()
    after = run()
    assert _mismatches(after, ops) == [] and _mismatches(after) == []
    with torch.no_grad():
        assert torch.equal(after(*inputs), before(*inputs))


class MaxOverChannels(torch.nn.Module):
    """``max(dim)``, which returns the values and their indices, between a dequantize and a
    quantize of other parameters (as a quantizer can leave it), with the indices returned."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor.default(x, 0.0029, -128, -128, 127, torch.int8)
        dq = qd.dequantize_per_tensor.default(q, 0.0029, -128, -128, 127, torch.int8)
        values, indices = torch.ops.aten.max.dim(dq, 1, True)
        out = qd.quantize_per_tensor.default(values, 1 / 127, 0, -127, 127, torch.int8)
        return qd.dequantize_per_tensor.default(out, 1 / 127, 0, -127, 127, torch.int8), indices


def test_an_op_with_several_results_reads_its_input_in_its_values_parameters() -> None:
    """Its float result (through ``getitem``) is quantized, its indices are not: the input is
    requantized into the values' parameters, and nothing the model computes changes."""
    x = torch.rand(1, 4, 5, 6, generator=torch.Generator().manual_seed(2)) * 0.7
    gm = torch.export.export(MaxOverChannels(), (x,)).module()
    assert isinstance(gm, GraphModule)
    expected = gm(x)
    (name,) = requantize_shared_inputs(gm)
    assert _mismatches(gm, frozenset({"aten::max"})) == []
    (m,) = [n for n in gm.graph.nodes if n.name == name]
    assert qparams_of(m.args[0])[:2] == (1 / 127, 0)
    values, indices = gm(x)
    assert torch.equal(values, expected[0]) and torch.equal(indices, expected[1])


class Negation(torch.nn.Module):
    """``neg`` between a dequantize and a quantize of other parameters."""

    def __init__(self, out: tuple[float, int, int, int]) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor.default(x, 0.0029, -128, -128, 127, torch.int8)
        dq = qd.dequantize_per_tensor.default(q, 0.0029, -128, -128, 127, torch.int8)
        out = qd.quantize_per_tensor.default(-dq, *self.out, torch.int8)
        return qd.dequantize_per_tensor.default(out, *self.out, torch.int8)


@pytest.mark.parametrize(
    "out", [(1 / 127, 0, -127, 127), (0.0031, -128, -128, 127), (0.0025, 5, -100, 90)]
)
def test_a_negation_reads_its_input_so_the_integer_negation_is_exact(
    out: tuple[float, int, int, int],
) -> None:
    """TOSA's ``NEGATE`` computes ``-(q - zero_in) + zero_out`` with no scale (ExecuTorch 1.5.1's
    Arm backend lowers an int8 ``neg`` to it): the input is requantized so that this integer
    negation of the requantized values is the model's quantized output, and the model's values
    do not change."""
    x = torch.linspace(-0.1, 0.8, 301).reshape(1, 1, 7, 43)
    gm = torch.export.export(Negation(out), (x,)).module()
    assert isinstance(gm, GraphModule)
    expected = gm(x)
    (name,) = requantize_shared_inputs(gm)
    assert torch.equal(gm(x), expected)
    (neg,) = [n for n in gm.graph.nodes if n.name == name]
    scale, zero_in, low, high, _ = qparams_of(neg.args[0])
    assert scale == out[0]
    qd = torch.ops.quantized_decomposed
    first = qd.quantize_per_tensor.default(x, 0.0029, -128, -128, 127, torch.int8)
    dequantized = qd.dequantize_per_tensor.default(first, 0.0029, -128, -128, 127, torch.int8)
    requantized = qd.quantize_per_tensor.default(dequantized, scale, zero_in, low, high, torch.int8)
    negated = torch.clamp(-(requantized.to(torch.int32) - zero_in) + out[1], -128, 127)
    wanted = qd.quantize_per_tensor.default(-dequantized, *out, torch.int8)
    assert torch.equal(negated.to(torch.int8), wanted)


class ConvResize(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(
            self.conv(x), size=(18, 10), mode="bilinear", align_corners=False
        )


@pytest.mark.parametrize("target", ["vgf", "xnnpack"])
def test_a_bilinear_resize_reads_its_input_in_its_output_parameters_on_arm_only(
    target: str,
) -> None:
    """Arm computes an int8 bilinear resize on the input's integers in the output's parameters
    (``INTERPOLATING_OPS``): there the resize's input is requantized. XNNPACK resizes in float,
    where a requantize would only add a rounding: there it is not."""
    x = torch.rand(1, 1, 9, 5, generator=torch.Generator().manual_seed(3))
    quantizer = BoundaryQuantizer(
        _base(target),  # type: ignore[arg-type]
        input_qspecs=(observed_int8(),),
        output_qspecs=(observed_int8(),),
    )
    gm = quantize(ConvResize().eval(), (x,), quantizer)
    mismatches = _mismatches(gm, INTERPOLATING_OPS)
    if target == "vgf":
        assert mismatches == []
        (resize,) = [n for n in gm.graph.nodes if "upsample_bilinear2d" in str(n.target)]
        (source,) = resize.all_input_nodes
        assert is_dequantize(source) and is_quantize(source.args[0])  # the requantize
    else:
        assert mismatches and mismatches[0].startswith("upsample_bilinear2d"), mismatches
