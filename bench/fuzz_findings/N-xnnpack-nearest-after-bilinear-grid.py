"""Fuzzed model (tests/model_fuzz.py, seed 2333; 1 inputs, 13 ops, 2 samplers, 1 outputs).

target xnnpack: failed_verification
verification failed: the written program is not within tolerance of the quantized PT2E model

Reproduce:
    etkit-export -m bench/fuzz_findings/N-xnnpack-nearest-after-bilinear-grid.py -t xnnpack --verify -o /tmp/N2 --force"""

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
        self.m1 = _conv(4, 15, 1, 1, 931520202)
        self.m2 = _theta(15, 516851492)
        self.m5 = _conv(15, 8, 3, 1, 528703217)
        self.m8 = _conv(15, 2, 1, 1, 726144205)
        self.m12 = _conv(16, 2, 1, 1, 926061463)

    def forward(self, x0):
        v1 = torch.tanh(x0)
        v2 = self.m1(v1)
        v3 = F.affine_grid(self.m2(F.adaptive_avg_pool2d(v2, 1).flatten(1)).view(-1, 2, 3), [2, 1, 11, 20], align_corners=False)
        v4 = F.grid_sample(v2, v3, mode='bilinear', padding_mode='reflection', align_corners=True)
        v5 = F.max_pool2d(v4, 2)
        v6 = self.m5(v5)
        v7 = F.relu(v6)
        v8 = v7 + v6
        v9 = torch.tanh(self.m8(v4)).permute(0, 2, 3, 1)
        v10 = F.grid_sample(v8, v9, mode='nearest', padding_mode='reflection', align_corners=False)
        v11 = F.interpolate(v10, size=(5, 10), mode='bilinear', align_corners=False)
        v12 = torch.cat([v6, v11], 1)
        v13 = torch.tanh(self.m12(v12)).permute(0, 2, 3, 1)
        return (v13,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((2, 4, 11, 20), 1014193075) * 2.0 + -1.0,
)
