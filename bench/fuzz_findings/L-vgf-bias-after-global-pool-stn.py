"""Fuzzed model (tests/model_fuzz.py, seed 1063; 1 inputs, 12 ops, 2 samplers, 1 outputs).

target vgf: crashed
ExportError: stage 'lower_main' failed: TosaValueError: Unsupported dtype torch.int8 for
GREATER_EQUAL

Reproduce:
    etkit-export -m bench/fuzz_findings/L-vgf-bias-after-global-pool-stn.py -t vgf --verify -o /tmp/L --force"""

import torch
import torch.nn.functional as F


def _conv(cin, cout, kernel, groups, seed):
    torch.manual_seed(seed)
    return torch.nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups)


def _theta(cin, seed):
    """A localization head: near the identity transform, moved by the features."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(cin, 6)
    with torch.no_grad():
        linear.weight.normal_(0.0, 0.1)
        linear.bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
    return linear


def _linear(cin, cout, seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(cin, cout)


def _flow_to_grid(flow, align_corners):
    """RIFE's warp arithmetic: a flow in pixels (x, y) added to the pixel grid, normalized."""
    n, _, height, width = flow.shape
    if align_corners:
        xs = torch.linspace(-1.0, 1.0, width)
        ys = torch.linspace(-1.0, 1.0, height)
        sx, sy = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    else:
        xs = (torch.arange(width) + 0.5) * (2.0 / width) - 1.0
        ys = (torch.arange(height) + 0.5) * (2.0 / height) - 1.0
        sx, sy = width / 2.0, height / 2.0
    base = torch.cat(
        [xs.view(1, 1, 1, width).expand(n, -1, height, -1),
         ys.view(1, 1, height, 1).expand(n, -1, -1, width)], 1
    )
    normalized = torch.cat([flow[:, 0:1] / sx, flow[:, 1:2] / sy], 1)
    return (base + normalized).permute(0, 2, 3, 1)


def _random(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = _conv(8, 2, 3, 1, 934635448)
        self.m2 = _conv(8, 1, 1, 1, 562815429)
        self.m6 = _theta(1, 436809669)

    def forward(self, x0):
        v1 = (self.m0(x0) * 0.6).permute(0, 2, 3, 1)
        v2 = F.grid_sample(x0, v1, mode='nearest', padding_mode='zeros', align_corners=False)
        v3 = self.m2(v2)
        v4 = torch.tanh(v3)
        v5 = v3 * v4
        v6 = F.avg_pool2d(x0, 2)
        v7 = F.affine_grid(self.m6(F.adaptive_avg_pool2d(v4, 1).flatten(1)).view(-1, 2, 3), [2, 1, 20, 15], align_corners=True)
        v8 = F.grid_sample(v6, v7, mode='bilinear', padding_mode='zeros', align_corners=False)
        v9 = torch.sigmoid(v8)
        v10 = F.avg_pool2d(v9, 2)
        v16 = F.interpolate(v10, size=(20, 15), mode='bilinear', align_corners=False)
        v17 = torch.cat([v5, v16], 1)
        return (v17,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((2, 8, 20, 15), 693558024) * 2.0 + -1.0,
)
