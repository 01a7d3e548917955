"""Class J (fuzzer seed 1030, VGF; hand-reduced): a localization head whose affine_grid is a
program output (float), not read by a sampler.

target vgf: crashed
ExportError: stage 'lower_main' failed: TosaValueError: Expected matching dtypes but got
torch.float32 and torch.int8 (a TOSA MUL in the Arm backend's aten-to-dialect pass).
The same head with theta as the output, or affine_grid feeding a sampler (the STN demo), exports.

Reproduce:
    etkit-export -m bench/fuzz_findings/J-vgf-affine-grid-output.py -t vgf --verify -o /tmp/J --force"""
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c = torch.nn.Conv2d(7, 8, 3, padding=1)
        self.l = torch.nn.Linear(8, 6)

    def forward(self, x):
        theta = self.l(self.c(x).mean((2, 3))).view(-1, 2, 3)
        return F.affine_grid(theta, [1, 1, 8, 4], align_corners=False)


ModelUnderTest = Model().eval()
ModelInputs = (torch.rand(1, 7, 16, 8),)
