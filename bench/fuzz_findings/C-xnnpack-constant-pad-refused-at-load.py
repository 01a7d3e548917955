"""Fuzzed model (tests/model_fuzz.py, seed 24; 1 inputs, 13 ops, 3 samplers, 1 outputs).

target xnnpack: crashed
ExportError: stage 'load' failed: RuntimeError: executorch.runtime refuses the written program:
Failed to load method forward, error: 0x:1; the runtime said: Failed to create StaticConstantPad
node 25 with code: xnn_status_invalid_parameter; XNNCompiler::compileModel failed: 0x1; Init
failed for backend XnnpackB

Reproduce:
    etkit-export -m bench/fuzz_findings/C-xnnpack-constant-pad-refused-at-load.py -t xnnpack --verify -o /tmp/seed24-xnnpack-min-xnnpack --force"""

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
        self.m0 = _conv(4, 2, 1, 1, 362176166)
        self.m5 = _conv(4, 3, 3, 1, 610188307)
        self.m6 = _conv(8, 2, 1, 1, 1061773374)
        self.m10 = _conv(3, 2, 1, 1, 443563529)

    def forward(self, x0):
        v1 = torch.tanh(self.m0(x0)).permute(0, 2, 3, 1)
        v2 = F.max_pool2d(x0, 2)
        v3 = F.grid_sample(v2, v1, mode='bilinear', padding_mode='zeros', align_corners=False)
        v4 = torch.cat([v3, x0], 1)
        v5 = F.relu(v4)
        v8 = self.m5(x0)
        v9 = torch.tanh(self.m6(v5)).permute(0, 2, 3, 1)
        v10 = F.grid_sample(v8, v9, mode='nearest', padding_mode='reflection', align_corners=True)
        v11 = F.pad(v10, (1, 2, 1, 2), mode='constant')
        v12 = v11.clamp(-0.5, 0.75)
        v13 = (self.m10(v12) * 0.6).permute(0, 2, 3, 1)
        v14 = v12[:, 0:2]
        v15 = F.grid_sample(v14, v13, mode='bilinear', padding_mode='border', align_corners=True)
        return (v15,)


ModelUnderTest = Model().eval()
ModelInputs = (
        _random((1, 4, 8, 9), 197110241) * 2.0 + -1.0,
)
