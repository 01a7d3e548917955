"""Fuzzed model (tests/model_fuzz.py, seed 2218; 3 inputs, 19 ops, 3 samplers, 1 outputs).

target xnnpack: failed_verification
verification failed: the written program is not within tolerance of the quantized PT2E model

Reproduce:
    etkit-export -m bench/fuzz_findings/R-xnnpack-four-logits-rounding.py -t xnnpack --verify -o /tmp/R --force"""

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
        self.m1 = _theta(8, 1044826652)
        self.m3 = _conv(8, 16, 3, 1, 709736494)
        self.m5 = _conv(8, 2, 1, 1, 522189036)
        self.m10 = _conv(8, 2, 3, 1, 838113953)
        self.m11 = _conv(8, 16, 1, 1, 160902667)
        self.m18 = _linear(14, 2, 157430213)

    def forward(self, x0, x1, x2):
        v1 = x2 - x0
        v2 = F.affine_grid(self.m1(F.adaptive_avg_pool2d(x2, 1).flatten(1)).view(-1, 2, 3), [2, 1, 20, 19], align_corners=True)
        v3 = F.grid_sample(v1, v2, mode='bilinear', padding_mode='zeros', align_corners=True)
        v4 = self.m3(v3)
        v5 = torch.sigmoid(v4)
        v6 = torch.tanh(self.m5(v3)).permute(0, 2, 3, 1)
        v7 = F.grid_sample(v5, v6, mode='nearest', padding_mode='reflection', align_corners=True)
        v8 = torch.cat([v7, x2], 1)
        v9 = v8[:, 19:24]
        v10 = F.relu(v9)
        v11 = torch.tanh(self.m10(x1)).permute(0, 2, 3, 1)
        v12 = self.m11(v1)
        v13 = v12[:, 8:9]
        v14 = F.grid_sample(v13, v11, mode='nearest', padding_mode='border', align_corners=True)
        v15 = torch.tanh(v14)
        v16 = torch.cat([v3, v10], 1)
        v17 = F.interpolate(v15, size=(20, 19), mode='bilinear', align_corners=False)
        v18 = torch.cat([v16, v17], 1)
        v19 = self.m18(F.adaptive_avg_pool2d(v18, 1).flatten(1))
        return (v19,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((2, 8, 20, 19), 291917972) * 2.0 + -1.0,
        _random((2, 8, 4, 19), 309757558) * 2.0 + -1.0,
        _random((2, 8, 20, 19), 1012659281) * 1.0 + 0.0,
)
