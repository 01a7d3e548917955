"""Quantizing never changes the caller's model: the Arm quantizer's annotation passes fold a
constant scale after a convolution into the convolution's weights by writing into the weight
tensor, which the exported graph shares with the caller's model."""

from __future__ import annotations

import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec

from etkit_quant import BoundaryQuantizer, quantize


class ScaledConv(torch.nn.Module):
    """A flow head: a convolution whose output is scaled by a constant (pixels per unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * 4.0


def _quantizer() -> BoundaryQuantizer:
    base = VgfQuantizer(VgfCompileSpec())
    base.set_global(get_symmetric_quantization_config())
    return BoundaryQuantizer(base, input_qspecs=[None], output_qspecs=[None])


def test_quantize_leaves_the_callers_weights_and_outputs_as_they_were() -> None:
    model = ScaledConv().eval()
    x = torch.rand(1, 4, 8, 8) * 2 - 1
    weight, bias = model.conv.weight.detach().clone(), model.conv.bias.detach().clone()
    with torch.no_grad():
        before = model(x)
    converted = quantize(model, (x,), _quantizer())
    assert torch.equal(model.conv.weight, weight)
    assert torch.equal(model.conv.bias, bias)
    with torch.no_grad():
        assert torch.equal(model(x), before)
        # and the quantized model still computes the scaled convolution (the fold is kept)
        error = (converted(x) - before).abs().max().item()
    assert error < 0.1 * before.abs().max().item()


def test_quantize_with_a_bare_base_quantizer_leaves_the_callers_weights() -> None:
    """The copy is ``quantize``'s, not only ``BoundaryQuantizer``'s: the stock VGF quantizer
    alone folds into a copy too."""
    model = ScaledConv().eval()
    x = torch.rand(1, 4, 8, 8) * 2 - 1
    weight = model.conv.weight.detach().clone()
    base = VgfQuantizer(VgfCompileSpec())
    base.set_global(get_symmetric_quantization_config())
    quantize(model, (x,), base)
    assert torch.equal(model.conv.weight, weight)
