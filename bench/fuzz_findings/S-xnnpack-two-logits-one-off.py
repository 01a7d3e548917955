"""Fuzzed model (tests/model_fuzz.py, seed 2302; 2 inputs, 6 ops, 1 samplers, 1 outputs).

target xnnpack: failed_verification
verification failed: the written program is not within tolerance of the quantized PT2E model

Reproduce:
    etkit-export -m bench/fuzz_findings/S-xnnpack-two-logits-one-off.py -t xnnpack --verify -o /tmp/S --force"""

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
        self.m4 = _conv(16, 3, 3, 1, 801663378)
        self.m5 = _linear(3, 2, 898582367)

    def forward(self, x0, x1):
        v1 = F.interpolate(x0, size=(8, 26), mode='nearest')
        v2 = F.max_pool2d(v1, 2)
        v3 = F.grid_sample(v2, x1, mode='bilinear', padding_mode='reflection', align_corners=False)
        v4 = F.pad(v3, (1, 0, 1, 0), mode='replicate')
        v5 = self.m4(v4)
        v7 = self.m5(F.adaptive_avg_pool2d(v5, 1).flatten(1))
        return (v7,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((1, 16, 4, 13), 227555437) * 2.0 + -1.0,
        (_random((1, 6, 20, 2), 613164174) * 2 - 1) * 1.0,
)
