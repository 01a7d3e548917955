"""``observer_states`` / ``load_observer_states``: one calibration serving another input size. A
model captured at two sizes, calibrated at one, converts at the other to the very same
quantization parameters; graphs that differ in more than their shapes are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx import GraphModule

from etkit_quant import observer_states, quantize
from etkit_quant.graph import attribute, is_dequantize, is_quantize


class Net(torch.nn.Module):
    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 3, 3, padding=1)
        with torch.no_grad():  # |w| < 127 * 2**-12: XNNPACK's smallest scale (eps) holds it
            self.b.weight.mul_(0.2)
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(F.relu(self.a(x)))
        return y + x if self.extra else y  # the add: an observer more


def _quantizer() -> object:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


def _qparams(converted: GraphModule) -> list[tuple[float, int]]:
    """The parameters of every quantize and dequantize, the weights' included (their quantize
    is folded into an int8 constant at conversion; their dequantize stays)."""
    return [
        (float(n.args[1]), int(n.args[2]))
        for n in converted.graph.nodes
        if is_quantize(n) or is_dequantize(n)
    ]


def _weights(converted: GraphModule) -> list[torch.Tensor]:
    constants = [attribute(converted, str(n.target)) for n in converted.graph.nodes
                 if n.op == "get_attr"]  # fmt: skip
    return [c for c in constants if isinstance(c, torch.Tensor) and c.dtype == torch.int8]


@pytest.mark.slow
def test_states_of_one_size_convert_another_to_the_same_parameters() -> None:
    small = (torch.rand(1, 3, 12, 16) * 2 - 1,)
    large = (torch.rand(1, 3, 20, 24) * 4 - 2,)  # other values: calibrating here would differ
    kept = []
    at_small = quantize(Net(), small, _quantizer(), on_calibrated=lambda p: kept.append(
        observer_states(p)))  # fmt: skip
    (states,) = kept
    assert len(states) > 0
    at_large = quantize(Net(), large, _quantizer(), observers=states)
    calibrated_there = quantize(Net(), large, _quantizer())
    assert _qparams(at_large) == _qparams(at_small)
    # the small weight's scale is XNNPACK's smallest (eps, 2**-12) at both sizes
    assert 2**-12 in [scale for scale, _ in _qparams(at_small)]
    assert all(
        torch.equal(a, b) for a, b in zip(_weights(at_large), _weights(at_small), strict=True)
    )
    assert _qparams(calibrated_there) != _qparams(at_small)
    assert tuple(at_large(*large).shape) == (1, 3, 20, 24)


@pytest.mark.slow
def test_a_graph_that_differs_in_more_than_its_shapes_is_refused() -> None:
    inputs = (torch.rand(1, 3, 12, 16),)
    kept = []
    quantize(Net(), inputs, _quantizer(), on_calibrated=lambda p: kept.append(observer_states(p)))
    with pytest.raises(ValueError, match="differs between the two input sizes"):
        quantize(Net(extra=True), inputs, _quantizer(), observers=kept[0])


class _Leaves(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return True


class _Observed(torch.nn.Module):
    """A weight read through one observer (or fake quantize), as prepare_pt2e leaves it."""

    def __init__(self, observer: torch.nn.Module) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.02, -0.01]))
        self.activation_post_process_0 = observer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.activation_post_process_0(self.w)


@pytest.mark.parametrize("qat", [False, True], ids=["observer", "fake-quantize"])
def test_the_smallest_scale_is_loaded_with_the_range(qat: bool) -> None:
    """``eps`` (2**-12 here, as XNNPACK's quantizer sets it) is part of the state: torchao's own
    loading skips it, for an observer and for a fake quantize's observer alike."""
    from torchao.quantization.pt2e.fake_quantize import FakeQuantize
    from torchao.quantization.pt2e.observer import MinMaxObserver

    from etkit_quant import load_observer_states

    args: dict[str, object] = dict(
        eps=2**-12, quant_min=-127, quant_max=127, dtype=torch.int8,
        qscheme=torch.per_tensor_symmetric,
    )  # fmt: skip
    make = FakeQuantize.with_args(observer=MinMaxObserver, **args) if qat else (
        MinMaxObserver.with_args(**args))  # fmt: skip

    def prepared() -> GraphModule:
        model = _Observed(make())
        return GraphModule(model, _Leaves().trace(model))

    calibrated, other = prepared(), prepared()
    calibrated(torch.zeros(2))
    states = observer_states(calibrated)
    load_observer_states(other, states)
    mine, theirs = (m.activation_post_process_0 for m in (other, calibrated))
    scale, _ = mine.calculate_qparams()
    assert float(scale) == 2**-12  # 0.02 / 127 without the floor
    assert torch.equal(scale, theirs.calculate_qparams()[0])
