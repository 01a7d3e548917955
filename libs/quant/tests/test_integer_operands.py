"""``integer_scalar_operands``: integer index arithmetic stays integer through a base quantizer's
``transform_for_annotation`` (ExecuTorch 1.5.1's XNNPACK quantizer made it float)."""

from __future__ import annotations

import torch

from etkit_quant.integer_operands import integer_scalar_operands


class Gather(torch.nn.Module):
    def forward(self, image: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        y = torch.clamp(position[:, 0], 0, 3).to(torch.int32)
        x = torch.clamp(position[:, 1], 0, 3).to(torch.int32)
        return image.reshape(16, 1)[y * 4 + x]


def _graph() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    inputs = (torch.arange(16.0).reshape(1, 1, 4, 4), torch.tensor([[2.7, 1.2], [0.4, 3.9]]))
    module = torch.export.export(Gather(), inputs, strict=True).module(check_guards=False)
    return module, inputs


def _xnnpack_transform(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    result: torch.fx.GraphModule = quantizer.transform_for_annotation(module)
    return result


def test_integer_operands_keep_the_values() -> None:
    module, inputs = _graph()
    want = module(*inputs)
    assert integer_scalar_operands(module)
    transformed = _xnnpack_transform(module)
    assert torch.equal(transformed(*inputs), want)


def test_upstream_xnnpack_transform_still_makes_index_arithmetic_float() -> None:
    """Without the step the XNNPACK quantizer's transform makes ``y * 4`` float and the gather
    fails. When this test fails, upstream converts only float operands and the step can go."""
    module, inputs = _graph()
    transformed = _xnnpack_transform(module)
    try:
        transformed(*inputs)
    except IndexError as error:
        assert "tensors used as indices" in str(error)
    else:
        raise AssertionError("the XNNPACK transform kept the index arithmetic integer")
