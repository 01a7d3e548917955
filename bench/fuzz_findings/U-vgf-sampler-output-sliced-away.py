"""Fuzzed model (tests/model_fuzz.py, seed 2786; 2 inputs, 13 ops, 2 samplers, 1 outputs).

target vgf: failed_verification
verification failed: the written program is not within tolerance of the quantized PT2E model
(13.1 dB; fixed by normalize.slices_of_cat: v9[:, 1:4] is all of v4, so v8's sampler feeds nothing)

Reproduce:
    etkit-export -m bench/fuzz_findings/U-vgf-sampler-output-sliced-away.py -t vgf --verify -o /tmp/U --force"""

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
        self.m3 = _conv(1, 3, 1, 1, 983296541)
        self.m5 = _conv(1, 2, 3, 1, 858370553)
        self.m12 = _conv(6, 1, 3, 1, 663828922)

    def forward(self, x0, x1):
        v1 = _flow_to_grid(x1, True)
        v2 = F.relu(x0)
        v3 = F.grid_sample(v2, v1, mode='bilinear', padding_mode='reflection', align_corners=True)
        v4 = self.m3(v3)
        v5 = F.max_pool2d(v4, 2)
        v6 = self.m5(x0) * 1.0
        v7 = _flow_to_grid(v6, False)
        v8 = F.grid_sample(v3, v7, mode='nearest', padding_mode='zeros', align_corners=True)
        v9 = torch.cat([v8, v4], 1)
        v10 = v9[:, 1:4]
        v11 = F.interpolate(v10, size=(8, 5), mode='bilinear', align_corners=False)
        v12 = torch.cat([v5, v11], 1)
        v13 = torch.sigmoid(self.m12(v12)) * 10.0
        return (v13,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((1, 1, 16, 11), 490362810) * 2.0 + -1.0,
        (_random((1, 2, 16, 11), 614732288) * 2 - 1) * 3.0,
)
