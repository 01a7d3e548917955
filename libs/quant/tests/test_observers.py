"""``observer_states`` / ``load_observer_states``: one calibration serving another input size. A
model captured at two sizes, calibrated at one, converts at the other to the very same
quantization parameters; graphs that differ in more than their shapes are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx import GraphModule

from etkit_quant import observer_states, quantize
from etkit_quant.graph import is_quantize


class Net(torch.nn.Module):
    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 3, 3, padding=1)
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
    return [(float(n.args[1]), int(n.args[2])) for n in converted.graph.nodes if is_quantize(n)]


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
    assert _qparams(calibrated_there) != _qparams(at_small)
    assert tuple(at_large(*large).shape) == (1, 3, 20, 24)


@pytest.mark.slow
def test_a_graph_that_differs_in_more_than_its_shapes_is_refused() -> None:
    inputs = (torch.rand(1, 3, 12, 16),)
    kept = []
    quantize(Net(), inputs, _quantizer(), on_calibrated=lambda p: kept.append(observer_states(p)))
    with pytest.raises(ValueError, match="differs between the two input sizes"):
        quantize(Net(extra=True), inputs, _quantizer(), observers=kept[0])
