"""A ``cat`` of a grid sampler's output: Arm's quantizer gives a grid sampler's output a fixed
SNORM8 range and ties a ``cat`` of it to that range; when etkit gives the sampler a calibrated
output instead (its image reaches past [-1, 1]), the concatenation must not keep the stale
[-1, 1] range, which clipped the sampler's output before the ``cat``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec
from quant_models import call_nodes, is_dequantize, pixel_grid, qparams_of, rand
from torch.fx import Interpreter

from etkit_quant import BoundaryQuantizer, observed_int8, quantize, snorm8
from etkit_quant.graph import is_grid_sampler


class WarpWideThenConcat(torch.nn.Module):
    """Features reaching past [-1, 1] warped, concatenated with the SNORM8 input image."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.features.weight.copy_(torch.eye(3).view(3, 3, 1, 1) * 2.5)
            self.features.bias.zero_()
        self.fuse = torch.nn.Conv2d(6, 2, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        grid = pixel_grid(8, 8) * 0.9
        warped = F.grid_sample(self.features(image), grid, align_corners=True)
        return self.fuse(torch.cat([warped, image], 1))


def _vgf_quantizer() -> BoundaryQuantizer:
    base = VgfQuantizer(VgfCompileSpec())
    base.set_global(get_symmetric_quantization_config())
    return BoundaryQuantizer(
        base,
        input_qspecs=[snorm8()],
        output_qspecs=[None],
        grid_sampler_image_qspec=observed_int8(),
        grid_sampler_output_qspec=observed_int8(),  # what the exporter calibrates past [-1, 1]
    )


def test_a_cat_of_a_calibrated_sampler_output_covers_its_range() -> None:
    model = WarpWideThenConcat().eval()
    image = rand(1, 3, 8, 8)
    gm = quantize(model, (image,), _vgf_quantizer())
    (cat,) = call_nodes(gm, lambda n: n.target == torch.ops.aten.cat.default)
    inputs = cat.args[0]
    assert isinstance(inputs, list) and all(is_dequantize(d) for d in inputs)
    params = {qparams_of(d) for d in inputs}
    assert len(params) == 1, params  # one scale over all inputs of the cat, as the backend needs
    scale, zero_point, _, quant_max, _ = params.pop()
    seen: dict[str, torch.Tensor] = {}

    class Record(Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            value = super().run_node(n)
            if is_grid_sampler(n):
                seen["warped"] = value
            return value

    with torch.no_grad():
        Record(gm).run(image)
    widest = float(seen["warped"].abs().max())
    assert widest > 1.5  # the sampler's output reaches well past [-1, 1] ...
    assert (quant_max - zero_point) * scale >= 0.99 * float(seen["warped"].max())  # ... unclipped
