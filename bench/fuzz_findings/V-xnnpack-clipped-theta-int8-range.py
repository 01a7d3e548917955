"""Fuzzed model (tests/model_fuzz.py, seed 6032; 1 inputs, 11 ops, 2 samplers, 1 outputs).

target xnnpack: failed_verification
verification failed: the written program is not within tolerance of the quantized PT2E model

Reproduce:
    etkit-export -m /tmp/fuzz-sound2/seed6032-xnnpack.py -t xnnpack --verify -o /tmp/seed6032-xnnpack-xnnpack --force"""

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
        self.m0 = _conv(4, 12, 3, 1, 268239481)
        self.m1 = _conv(4, 2, 1, 1, 790451624)
        self.m7 = _theta(16, 548233212)
        self.m10 = _conv(28, 4, 1, 1, 991785042)

    def forward(self, x0):
        v1 = self.m0(x0)
        v2 = self.m1(x0) * 2.0
        v3 = _flow_to_grid(v2, True)
        v4 = F.grid_sample(v1, v3, mode='bilinear', padding_mode='border', align_corners=False)
        v5 = torch.cat([v4, x0], 1)
        v6 = F.pad(v5, (1, 2, 0, 1), mode='replicate')
        v7 = F.relu(v1)
        v8 = F.affine_grid(self.m7(F.adaptive_avg_pool2d(v6, 1).flatten(1)).view(-1, 2, 3), [1, 1, 14, 22], align_corners=True)
        v9 = F.grid_sample(v7, v8, mode='nearest', padding_mode='zeros', align_corners=False)
        v10 = torch.cat([v6, v9], 1)
        v11 = self.m10(v10)
        return (v11,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((1, 4, 13, 19), 233404201) * 2.0 + -1.0,
)
