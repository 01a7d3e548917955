"""Fuzzed model (tests/model_fuzz.py, seed 1055; 1 inputs, 10 ops, 2 samplers, 1 outputs).

target vgf: crashed
ExportError: stage 'verify' failed: ExecutionError: instruction 6: delegate 1 (VgfBackend):
scenario_runner failed (exit 255): ... 2026-11-25 21:51:10,779 [Scenario-Runner] ERROR: No
resource found for VGF binding

Reproduce:
    etkit-export -m bench/fuzz_findings/M-vgf-compute-input-also-vgf-output.py -t vgf --verify -o /tmp/M --force"""

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
        self.m0 = _conv(3, 4, 3, 1, 169937948)
        self.m2 = _conv(4, 2, 3, 1, 661944706)
        self.m4 = _conv(4, 2, 1, 1, 35283510)
        self.m5 = _theta(4, 17135453)

    def forward(self, x1):
        v1 = self.m0(x1)
        v2 = torch.sigmoid(v1)
        v3 = (self.m2(v1) * 0.6).permute(0, 2, 3, 1)
        v4 = F.grid_sample(v2, v3, mode='bicubic', padding_mode='border', align_corners=False)
        v5 = self.m4(v4)
        v6 = F.affine_grid(self.m5(F.adaptive_avg_pool2d(v1, 1).flatten(1)).view(-1, 2, 3), [2, 1, 8, 16], align_corners=False)
        v7 = F.grid_sample(v2, v6, mode='bilinear', padding_mode='border', align_corners=True)
        v8 = torch.cat([v7, v2], 1)
        v9 = v8[:, 3:5]
        v13 = torch.cat([v5, v9], 1)
        return (v13,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((2, 3, 8, 16), 763008310) * 2.0 + -1.0,
)
