"""Two tensors warped by one flow: RIFE's warp() builds the same sampling grid twice (class P).

VGF, split (--sampler-delegate): 14.4 dB from PT2E, 96.7 % of values off; the first VGF's
grid output diverges (12.4 dB). VGF, one VGF: model-converter exits 255 ('spirv.ARM.Graph' op
there should be at least one result). XNNPACK verifies. With the grid built once in the model,
the split program verifies (80.0 dB) and the one-VGF one still exits 255.

Reproduce:
    etkit-export -m bench/fuzz_findings/P-vgf-twin-grids.py -t vgf --verify --sampler-delegate -o /tmp/P --force"""

import torch
import torch.nn.functional as F

def warp(x, flow):
    n, _, h, w = flow.shape
    horizontal = torch.linspace(-1.0, 1.0, w).view(1, 1, 1, w).expand(n, -1, h, -1)
    vertical = torch.linspace(-1.0, 1.0, h).view(1, 1, h, 1).expand(n, -1, -1, w)
    grid = torch.cat([horizontal, vertical], 1)
    flow = torch.cat([flow[:, 0:1] / ((w - 1.0) / 2.0), flow[:, 1:2] / ((h - 1.0) / 2.0)], 1)
    return F.grid_sample(x, (grid + flow).permute(0, 2, 3, 1), mode="bilinear", padding_mode="border", align_corners=True)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.flow = torch.nn.Conv2d(8, 2, 3, padding=1)
        self.feat = torch.nn.Conv2d(4, 4, 3, padding=1)
    def forward(self, x):
        a, b = x[:, :4], x[:, 4:]
        flow = self.flow(x) * 4.0
        return (warp(a, flow) + warp(self.feat(b), flow),)

ModelUnderTest = Model().eval()
ModelInputs = (torch.rand(1, 8, 16, 24, generator=torch.Generator().manual_seed(1)) * 2 - 1,)
