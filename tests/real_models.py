"""Models written in the shape of public grid-sampling models, to test the class of models real
users export (not the demos: those put the image first and the grid second, and no value crosses
a grid sampler).

Each factory returns ``(model, example_inputs)`` with weights from a fixed seed, like
``etkit_exporter.demos``; ``REAL_MODELS`` pairs each with the quantization a user would ask for at
its boundaries and what its outputs are (images, logits, depth, flow; bilinear or nearest samples
straight out of a grid sampler). A group of small models covers few channels around a sampler
(1-channel inputs, 1/2/4/16-channel outputs, shapes at which NCHW and NHWC are the same bytes,
batch 2, ReLUs before SNORM8 tensors, inputs that feed two ops). ExecuTorch's own Arm
grid-sampler conformance test is read programmatically (``conformance_cases``), so cases added
there are picked up.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant import covering, fixed, qformat, snorm8

Factory = Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
Qspecs = tuple[QuantizationSpec | None, ...] | None

ARM_CONFORMANCE_MODULE = "executorch.backends.arm.test.ops.test_grid_sampler"


# -- building blocks, as the public models write them ---------------------------------------


def conv(cin: int, cout: int, kernel: int = 3, stride: int = 1) -> torch.nn.Sequential:
    """RIFE's ``conv``: a convolution and a PReLU-like activation (LeakyReLU here)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2), torch.nn.LeakyReLU(0.2)
    )


def backward_warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """RIFE's ``warplayer.warp``: ``flow`` in pixels (x, y) converted to a normalized grid around
    the align_corners=True pixel grid; bilinear, border padding."""
    n, _, height, width = flow.shape
    xs = torch.linspace(-1.0, 1.0, width).view(1, 1, 1, width).expand(n, -1, height, -1)
    ys = torch.linspace(-1.0, 1.0, height).view(1, 1, height, 1).expand(n, -1, -1, width)
    base = torch.cat([xs, ys], 1)
    normalized = torch.cat(
        [flow[:, 0:1] / ((width - 1.0) / 2.0), flow[:, 1:2] / ((height - 1.0) / 2.0)], 1
    )
    grid = (base + normalized).permute(0, 2, 3, 1)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)


def pixel_grid(n: int, height: int, width: int) -> torch.Tensor:
    """The identity grid, n x height x width x 2 (align_corners=True convention)."""
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0).expand(n, -1, -1, -1)


# -- RIFE: a shared encoder, an IFNet of two blocks, backward warps, a mask blend -------------


class IFBlock(torch.nn.Module):
    """RIFE's IFBlock: the input at 1/scale, a strided conv and a residual conv, flow (4
    channels: to frame 0 and to frame 1, pixels) and a mask logit, interpolated back up."""

    def __init__(self, cin: int, c: int = 16) -> None:
        super().__init__()
        self.conv0 = conv(cin, c, 3, 2)
        self.convblock = conv(c, c)
        self.lastconv = torch.nn.Conv2d(c, 5, 3, 1, 1)

    def forward(
        self, x: torch.Tensor, flow: torch.Tensor | None, scale: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.interpolate(x, scale_factor=1.0 / scale, mode="bilinear", align_corners=False)
        if flow is not None:
            flow = (
                F.interpolate(flow, scale_factor=1.0 / scale, mode="bilinear", align_corners=False)
                / scale
            )
            x = torch.cat((x, flow), 1)
        feat = self.conv0(x)
        feat = self.convblock(feat) + feat
        tmp = F.interpolate(
            self.lastconv(feat), scale_factor=2 * scale, mode="bilinear", align_corners=False
        )
        return tmp[:, :4] * scale, tmp[:, 4:5]


class RIFE(torch.nn.Module):
    """RIFE v4's IFNet in small: a shared encoder on both frames; IFBlocks at scales 4 and 2
    (``scales``), the later ones refining flow and mask from the frames warped by the flow so
    far; two backward warps per block; ``warped0 * mask + warped1 * (1 - mask)`` with a
    sigmoid mask."""

    def __init__(self, scales: tuple[int, ...] = (4, 2), c: int = 16) -> None:
        super().__init__()
        self.encode = torch.nn.Sequential(conv(3, 8), torch.nn.Conv2d(8, 4, 3, 1, 1))
        self.scales = scales
        self.blocks = torch.nn.ModuleList(
            [IFBlock(3 + 3 + 4 + 4, c)] + [IFBlock(3 + 3 + 4 + 4 + 1 + 4, c) for _ in scales[1:]]
        )

    def forward(self, img0: torch.Tensor, img1: torch.Tensor) -> torch.Tensor:
        f0, f1 = self.encode(img0), self.encode(img1)
        flow, mask = self.blocks[0](torch.cat((img0, img1, f0, f1), 1), None, self.scales[0])
        warped0, warped1 = backward_warp(img0, flow[:, :2]), backward_warp(img1, flow[:, 2:4])
        for block, scale in zip(self.blocks[1:], self.scales[1:], strict=True):
            inputs = torch.cat((warped0, warped1, f0, f1, mask), 1)
            flow_delta, mask_delta = block(inputs, flow, scale)
            flow, mask = flow + flow_delta, mask + mask_delta
            warped0, warped1 = backward_warp(img0, flow[:, :2]), backward_warp(img1, flow[:, 2:4])
        m = torch.sigmoid(mask)
        return warped0 * m + warped1 * (1 - m)


def rife() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(10)
    model = RIFE().eval()
    with torch.no_grad():  # flows of a few pixels, as a trained RIFE predicts for nearby frames
        for block in model.blocks:
            block.lastconv.weight.mul_(4.0)
    frame = _smooth_image(1, 3, 32, 48, seed=11)  # RIFE's frames are [0, 1]
    shifted = torch.roll(frame, shifts=(1, 2), dims=(2, 3))
    return model, ((frame + 1) / 2, (shifted + 1) / 2)


# -- the PyTorch spatial-transformer tutorial --------------------------------------------------


class SpatialTransformerTutorial(torch.nn.Module):
    """``Net`` of the PyTorch spatial-transformer tutorial (MNIST): localization net ->
    fc_loc -> affine_grid -> grid_sample -> conv classifier -> log_softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)
        self.localization = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, kernel_size=7),
            torch.nn.MaxPool2d(2, stride=2),
            torch.nn.ReLU(True),
            torch.nn.Conv2d(8, 10, kernel_size=5),
            torch.nn.MaxPool2d(2, stride=2),
            torch.nn.ReLU(True),
        )
        self.fc_loc = torch.nn.Sequential(
            torch.nn.Linear(10 * 3 * 3, 32), torch.nn.ReLU(True), torch.nn.Linear(32, 3 * 2)
        )
        # The tutorial starts from the identity; a trained one has moved away from it.
        assert isinstance(self.fc_loc[2], torch.nn.Linear)
        self.fc_loc[2].weight.data.normal_(0.0, 0.05)
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))

    def stn(self, x: torch.Tensor) -> torch.Tensor:
        xs = self.localization(x)
        xs = xs.view(-1, 10 * 3 * 3)
        theta = self.fc_loc(xs).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stn(x)
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def mnist_input_qspec() -> QuantizationSpec:
    """The raw pixel a user feeds, shifted to int8 (etkit refuses uint8 boundaries: ExecuTorch
    1.5.1's XNNPACK computes them as int8, VGF cannot pad them): value = ((q + 128) / 255 - mean)
    / std."""
    scale = 1 / (255 * MNIST_STD)
    return fixed(scale, round(MNIST_MEAN / MNIST_STD / scale) - 128, torch.int8, -128, 127)


def stn_tutorial() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(20)
    model = SpatialTransformerTutorial().eval()
    with torch.no_grad():  # confident logits, as a trained classifier's
        model.fc2.weight.mul_(6.0)
    digits = (_smooth_image(2, 1, 28, 28, seed=21) > 0.2).float()  # strokes on black, 0 or 1
    blurred = F.avg_pool2d(digits, 3, 1, 1)
    return model, (((blurred - MNIST_MEAN) / MNIST_STD),)


# -- RAFT: shared encoder, all-pairs correlation, a two-level lookup, an update head ----------


class RAFT(torch.nn.Module):
    """RAFT in small: a feature encoder shared by both frames (1/4 resolution), a context
    encoder, the all-pairs correlation volume as a batch of h*w one-channel maps with a 2-level
    average-pooled pyramid, ``CorrBlock``'s lookup (grid_sample, align_corners=True, at
    coords + a (2r+1)^2 window, zeros padding), two iterations of an update head on
    [correlation, flow, context], flow upsampled to full resolution (pixels), and frame 1
    backward-warped by it."""

    def __init__(self, radius: int = 1, levels: int = 2, iterations: int = 2) -> None:
        super().__init__()
        self.radius, self.levels, self.iterations = radius, levels, iterations
        self.fnet = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 7, 2, 3),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, 2, 1),
        )
        self.cnet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, 4, 3), torch.nn.ReLU())
        window = levels * (2 * radius + 1) ** 2
        self.update = torch.nn.Sequential(
            torch.nn.Conv2d(window + 2 + 8, 32, 3, 1, 1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 2, 3, 1, 1),
        )

    def lookup(self, pyramid: list[torch.Tensor], coords: torch.Tensor) -> torch.Tensor:
        r = self.radius
        n, _, h, w = coords.shape
        centre = coords.permute(0, 2, 3, 1)
        d = torch.linspace(-r, r, 2 * r + 1)
        delta = torch.stack(torch.meshgrid(d, d, indexing="ij"), dim=-1).view(
            1, 2 * r + 1, 2 * r + 1, 2
        )
        out = []
        for i, corr in enumerate(pyramid):
            centroid = centre.reshape(n * h * w, 1, 1, 2) / 2**i
            xy = centroid + delta
            height, width = corr.shape[-2:]
            x, y = xy.split([1, 1], dim=-1)
            grid = torch.cat([2 * x / (width - 1) - 1, 2 * y / (height - 1) - 1], dim=-1)
            sampled = F.grid_sample(corr, grid, align_corners=True)
            out.append(sampled.view(n, h, w, -1))
        return torch.cat(out, dim=-1).permute(0, 3, 1, 2)

    def forward(
        self, image1: torch.Tensor, image2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fmap1, fmap2 = self.fnet(image1), self.fnet(image2)
        n, c, h, w = fmap1.shape
        corr = torch.matmul(fmap1.view(n, c, h * w).transpose(1, 2), fmap2.view(n, c, h * w))
        corr = corr.view(n * h * w, 1, h, w) / math.sqrt(c)
        pyramid = [corr]
        for _ in range(self.levels - 1):
            pyramid.append(F.avg_pool2d(pyramid[-1], 2, stride=2))
        context = self.cnet(image1)
        ys, xs = torch.meshgrid(torch.arange(h).float(), torch.arange(w).float(), indexing="ij")
        coords0 = torch.stack([xs, ys], 0).unsqueeze(0).expand(n, -1, -1, -1)
        flow = torch.zeros(n, 2, h, w)
        for _ in range(self.iterations):
            correlation = self.lookup(pyramid, coords0 + flow)
            flow = flow + self.update(torch.cat([correlation, flow, context], 1))
        scale = image1.shape[-1] // w
        flow_up = scale * F.interpolate(
            flow, scale_factor=scale, mode="bilinear", align_corners=True
        )
        return flow_up, backward_warp(image2, flow_up)


def raft() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(30)
    model = RAFT().eval()
    with torch.no_grad():  # updates of a pixel or two per iteration, as a trained RAFT's
        model.update[2].weight.mul_(8.0)
    frame = _smooth_image(1, 3, 32, 32, seed=31)
    return model, (frame, torch.roll(frame, shifts=(1, -2), dims=(2, 3)))


# -- argument order: grid first; a grid computed before the image; RGB padded to RGBA ---------


class GridFirst(torch.nn.Module):
    """A resampler whose first input is the grid and second the image (as in ``remap(grid,
    image)`` APIs), with a bilinear and a nearest output."""

    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        smooth = F.grid_sample(image, grid, padding_mode="zeros", align_corners=False)
        sharp = F.grid_sample(
            image, grid, mode="nearest", padding_mode="border", align_corners=True
        )
        return smooth, sharp


def grid_first() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(40)
    grid = torch.rand(1, 16, 20, 2) * 2 - 1
    return GridFirst().eval(), (grid, _smooth_image(1, 4, 24, 24, seed=41))


class GridBeforeImage(torch.nn.Module):
    """The grid is computed by conv layers before the image (16 feature channels) is produced
    from the same input; the sampled features are mixed back to RGB."""

    def __init__(self) -> None:
        super().__init__()
        self.offsets = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 3, 1, 1)
        )
        self.features = torch.nn.Conv2d(3, 16, 3, 1, 1)
        self.mix = torch.nn.Conv2d(16, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        grid = pixel_grid(n, h, w) + torch.tanh(self.offsets(x)).permute(0, 2, 3, 1) * 0.1
        image = self.features(x)
        sampled = F.grid_sample(image, grid, padding_mode="reflection", align_corners=False)
        return torch.clamp(self.mix(sampled), -1, 1)


def grid_before_image() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(50)
    return GridBeforeImage().eval(), (_smooth_image(1, 3, 24, 32, seed=51),)


class RGBToRGBAWarp(torch.nn.Module):
    """The model pads its RGB input to RGBA itself (alpha = 1) and warps it by a flow input in
    pixels; the output is RGBA."""

    def forward(self, rgb: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        rgba = torch.cat([rgb, torch.ones_like(rgb[:, :1])], 1)
        return backward_warp(rgba, flow)


def rgb_to_rgba_warp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(60)
    flow = (torch.rand(1, 2, 24, 32) * 2 - 1) * 3  # pixels
    return RGBToRGBAWarp().eval(), (_smooth_image(1, 3, 24, 32, seed=61), flow)


# -- values crossing a grid sampler ------------------------------------------------------------


class MaskedWarp(torch.nn.Module):
    """A flow head predicts flow and an occlusion mask; ``grid_sample(img, grid) * mask``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 3, 3, 1, 1)
        )

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        out = self.head(torch.cat([frame0, frame1], 1))
        flow = torch.tanh(out[:, :2]) * 2.0  # pixels
        mask = torch.sigmoid(out[:, 2:3])
        return backward_warp(frame0, flow) * mask


def masked_warp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(70)
    return MaskedWarp().eval(), (
        _smooth_image(2, 3, 24, 32, seed=71),
        _smooth_image(2, 3, 24, 32, seed=72),
    )


class WarpConcat(torch.nn.Module):
    """Features (16 channels) warped by a flow predicted from them, concatenated with the
    un-warped features, fused to RGB."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 1, 1), torch.nn.ReLU())
        self.flow = torch.nn.Conv2d(16, 2, 3, 1, 1)
        self.fuse = torch.nn.Conv2d(32, 3, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.features(x)
        warped = backward_warp(feats, torch.tanh(self.flow(feats)) * 2.0)
        return self.fuse(torch.cat([warped, feats], 1))


def warp_concat() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(80)
    return WarpConcat().eval(), (_smooth_image(1, 3, 24, 32, seed=81),)


# -- a non-image output: depth in metres ------------------------------------------------------


class StereoDepth(torch.nn.Module):
    """Monodepth-style: a disparity head on the stereo pair, the right image warped to the left
    view by the disparity (bilinear, border), depth in metres in [0, 10] from the left image and
    the reconstruction."""

    def __init__(self) -> None:
        super().__init__()
        self.disparity = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 1, 3, 1, 1)
        )
        self.depth = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 1, 3, 1, 1)
        )

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, _, h, w = left.shape
        disparity = torch.sigmoid(self.disparity(torch.cat([left, right], 1))) * 0.1  # of width
        shift = torch.cat([-2 * disparity, torch.zeros_like(disparity)], 1).permute(0, 2, 3, 1)
        reconstructed = F.grid_sample(
            right, pixel_grid(n, h, w) + shift, padding_mode="border", align_corners=True
        )
        depth = 10.0 * torch.sigmoid(self.depth(torch.cat([left, reconstructed], 1)))
        return depth, reconstructed


def stereo_depth() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(90)
    model = StereoDepth().eval()
    with torch.no_grad():  # depths spread over metres, not around 5 m
        model.depth[2].weight.mul_(4.0)
    left = _smooth_image(2, 3, 24, 32, seed=91)
    return model, (left, torch.roll(left, shifts=-2, dims=3))


# -- few channels around a sampler: 1-channel inputs, 1/2/4/16-channel outputs, ReLUs ----------
# The class of the spatial-transformer front end a new user tried first: channel counts at which
# NCHW and NHWC are the same bytes (C = 1, H = W = 1), outputs that come straight from a VGF
# partition, batch 2, and ReLUs before tensors etkit quantizes with a fixed symmetric qspec
# (SNORM8 at an output or at a sampler's image), which the Arm backend once folded away.


class STNFrontEnd(torch.nn.Module):
    """A spatial-transformer classifier's front end: a 1-channel 28 x 28 image, a localization
    net (conv, pool, linear) regressing an affine theta, ``affine_grid`` + ``grid_sample``
    (bilinear, zeros), then a 1 -> 4 channel conv + ReLU as the output (the features a
    classifier reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.localization = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 7),
            torch.nn.MaxPool2d(2, 2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 10, 5),
            torch.nn.MaxPool2d(2, 2),
            torch.nn.ReLU(),
        )
        self.fc_loc = torch.nn.Sequential(
            torch.nn.Linear(90, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6)
        )
        last = self.fc_loc[2]
        assert isinstance(last, torch.nn.Linear)
        last.weight.data.normal_(0.0, 0.05)  # near the identity, as a trained one
        last.bias.data.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
        self.features = torch.nn.Conv2d(1, 4, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.fc_loc(self.localization(x).flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        warped = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return F.relu(self.features(warped))


def stn_front_end() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(100)
    return STNFrontEnd().eval(), (_smooth_image(1, 1, 28, 28, seed=101),)


class WarpThenFeatures(torch.nn.Module):
    """A 1-channel image and a grid input: the image (through a 1-channel conv + ReLU) sampled
    by the grid, then a conv to ``channels`` channels + ReLU as the output (it comes straight
    from a VGF partition, SNORM8)."""

    def __init__(self, channels: int, mode: str, padding: str, align_corners: bool) -> None:
        super().__init__()
        self.smooth = torch.nn.Conv2d(1, 1, 3, 1, 1)
        self.features = torch.nn.Conv2d(1, channels, 3, 1, 1)
        self.mode, self.padding, self.align_corners = mode, padding, align_corners

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        sampled = F.grid_sample(
            F.relu(self.smooth(image)),
            grid,
            mode=self.mode,
            padding_mode=self.padding,
            align_corners=self.align_corners,
        )
        return F.relu(self.features(sampled))


def warp_then_features(
    channels: int,
    size: tuple[int, int] = (20, 24),
    out_size: tuple[int, int] = (18, 22),
    batch: int = 1,
    mode: str = "bilinear",
    padding: str = "reflection",
    align_corners: bool = True,
) -> Factory:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(110 + channels)
        model = WarpThenFeatures(channels, mode, padding, align_corners).eval()
        image = _smooth_image(batch, 1, *size, seed=111 + channels)
        grid = torch.rand(batch, *out_size, 2, generator=torch.Generator().manual_seed(112))
        grid = grid * 2.2 - 1.1  # some samples outside the image
        if out_size == (1, 1):  # one glimpse per frame, at its brightest feature
            with torch.no_grad():
                features = F.relu(model.smooth(image)).flatten(1)
            rows, cols = features.argmax(1) // size[1], features.argmax(1) % size[1]
            grid = torch.stack((2 * cols / (size[1] - 1) - 1, 2 * rows / (size[0] - 1) - 1), -1)
            grid = grid.view(batch, 1, 1, 2).float()
        with torch.no_grad():  # outputs reaching 0.8: export_model's default for them is SNORM8
            peak = float(model(image, grid).max())
            model.features.weight.mul_(0.8 / peak)
            model.features.bias.mul_(0.8 / peak)
        return model, (image, grid)

    return make


class NearestBatchWarp(torch.nn.Module):
    """Batch 2, 2 channels: a conv + ReLU on the frames, sampled nearest with zeros padding by
    a grid input, mixed back to 2 channels (the output comes from a conv, not a sampler)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(2, 2, 3, 1, 1)
        self.mix = torch.nn.Conv2d(2, 2, 1)

    def forward(self, frames: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        features = F.relu(self.features(frames))
        sampled = F.grid_sample(
            features, grid, mode="nearest", padding_mode="zeros", align_corners=False
        )
        return self.mix(sampled)


def nearest_batch_warp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(120)
    model = NearestBatchWarp().eval()
    with torch.no_grad():
        model.features.weight.mul_(0.5)
    grid = torch.rand(2, 15, 17, 2, generator=torch.Generator().manual_seed(121)) * 2 - 1
    return model, (_smooth_image(2, 2, 16, 20, seed=122), grid)


class InputsFeedTwoOps(torch.nn.Module):
    """Each input feeds two ops: the image (values in [0, 3], not SNORM) is sampled and goes
    through a conv; the grid is sampled by and, permuted to channels, goes through a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.image_conv = torch.nn.Conv2d(4, 4, 3, 1, 1)
        self.grid_conv = torch.nn.Conv2d(2, 4, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        warped = F.grid_sample(image, grid, align_corners=True)
        return warped + self.image_conv(image) + self.grid_conv(grid.permute(0, 3, 1, 2))


def inputs_feed_two_ops() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(130)
    grid = torch.rand(1, 12, 16, 2, generator=torch.Generator().manual_seed(131)) * 2 - 1
    image = (_smooth_image(1, 4, 12, 16, seed=132) + 1) * 1.5
    return InputsFeedTwoOps().eval(), (image, grid)


# -- ExecuTorch's Arm grid-sampler conformance test --------------------------------------------


def conformance_module() -> ModuleType:
    return importlib.import_module(ARM_CONFORMANCE_MODULE)


def _conformance_suites(module: ModuleType) -> dict[str, dict[str, Callable[[], Any]]]:
    """Every test-data suite of the module: module-level dicts of zero-argument callables."""
    suites = {}
    for name, value in vars(module).items():
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(k, str) and callable(v) for k, v in value.items())
            and all(not inspect.signature(v).parameters for v in value.values())
        ):
            suites[name] = value
    return suites


def _conformance_models(module: ModuleType) -> dict[str, type[torch.nn.Module]]:
    return {
        name: cls
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, torch.nn.Module)
        and cls.__module__ == module.__name__
    }


def covering_qformat(x: torch.Tensor, bits: int) -> QuantizationSpec:
    """The Q-format of ``bits`` (8 or 16) with the most fractional bits that still holds every
    value of ``x``: what a user picks for data outside [-1, 1]."""
    limit = 2 ** (bits - 1) - 1
    peak = float(x.abs().max())
    frac_bits = bits - 1 - max(0, math.ceil(math.log2(peak * 2 ** (bits - 1) / limit)))
    return qformat(frac_bits, bits=bits)


# -- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NearestOutput:
    """An output that is a nearest-mode grid sampler applied straight to model inputs."""

    image_input: int
    grid_input: int
    align_corners: bool


@dataclass(frozen=True)
class RealModel:
    """A model with the boundary quantization a user would ask for.

    ``input_qspecs``/``output_qspecs``: passed to ``export_model`` (``None``: its defaults).
    ``outputs``: what each output is: "image", "logits", "depth", "flow", "bilinear" (a bilinear
    grid sampler's output, straight out), "nearest" (see ``nearest``)."""

    name: str
    make: Factory
    input_qspecs: Qspecs = None
    output_qspecs: Qspecs = None
    outputs: tuple[str, ...] = ("image",)
    nearest: dict[int, NearestOutput] = field(default_factory=dict)


def _as_inputs(made: Any) -> tuple[torch.Tensor, ...]:
    return tuple(made) if isinstance(made, tuple | list) else (made,)


def _conformance_factory(
    model_class: type[torch.nn.Module], make_inputs: Callable[[], Any]
) -> Factory:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)  # the suites draw torch.randn
        return model_class().eval(), _as_inputs(make_inputs())

    return make


def _conformance_cases() -> Iterator[RealModel]:
    module = conformance_module()
    for suite_name, suite in _conformance_suites(module).items():
        for case_name, make_inputs in suite.items():
            for model_name, model_class in _conformance_models(module).items():
                make = _conformance_factory(model_class, make_inputs)
                image, grid = make()[1][:2]
                # The data are torch.randn: a user gives qspecs that hold them (Q-formats).
                yield RealModel(
                    name=f"arm-{model_name}-{suite_name}-{case_name}",
                    make=make,
                    input_qspecs=(covering_qformat(image, 8), covering_qformat(grid, 16)),
                    output_qspecs=(covering_qformat(image, 8),),
                    outputs=("bilinear",),
                )


def conformance_cases() -> list[RealModel]:
    """Every model class and every test-data entry of ExecuTorch's Arm grid-sampler test."""
    return list(_conformance_cases())


def _smooth_image(n: int, c: int, h: int, w: int, seed: int) -> torch.Tensor:
    """A natural-looking image in [-1, 1]: low-pass noise, not white noise (real frames are
    smooth, and their warps are judged on them)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(n, c, h // 4 + 2, w // 4 + 2, generator=generator)
    image = F.interpolate(noise, size=(h, w), mode="bicubic", align_corners=False)
    image = image - image.amin(dim=(2, 3), keepdim=True)
    return (image / image.amax(dim=(2, 3), keepdim=True)) * 2 - 1


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel("rife", rife, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),)),
        RealModel(
            "stn-tutorial",
            stn_tutorial,
            input_qspecs=(mnist_input_qspec(),),
            output_qspecs=(None,),  # log-probabilities, in float
            outputs=("logits",),
        ),
        RealModel(
            "raft",
            raft,
            input_qspecs=(snorm8(), snorm8()),
            output_qspecs=(qformat(3), snorm8()),  # flow: 1/8 pixel steps, +-15.9 pixels
            outputs=("flow", "image"),
        ),
        RealModel(
            "grid-first",
            grid_first,
            input_qspecs=None,  # export_model's defaults: SNORM16 grid, SNORM8 image
            output_qspecs=(snorm8(), snorm8()),
            outputs=("bilinear", "nearest"),
            nearest={1: NearestOutput(image_input=1, grid_input=0, align_corners=True)},
        ),
        RealModel("grid-before-image", grid_before_image),
        RealModel(
            "rgb-to-rgba-warp",
            rgb_to_rgba_warp,
            input_qspecs=(snorm8(), qformat(4)),  # flow: 1/16 pixel steps, +-7.9 pixels
            output_qspecs=(snorm8(),),
            outputs=("bilinear",),
        ),
        RealModel("masked-warp", masked_warp),
        RealModel("warp-concat", warp_concat),
        RealModel(
            "stereo-depth",
            stereo_depth,
            input_qspecs=(snorm8(), snorm8()),
            output_qspecs=(covering(10.0, torch.int8), snorm8()),  # metres, 16/127 steps
            outputs=("depth", "bilinear"),
        ),
        RealModel("stn-front-end", stn_front_end),  # export_model's defaults: SNORM8 IO
        RealModel("warp-features-1ch", warp_then_features(1)),
        RealModel(
            "warp-features-2ch",
            warp_then_features(2, mode="bilinear", padding="zeros", align_corners=False),
        ),
        RealModel("warp-features-4ch", warp_then_features(4, size=(39, 39), out_size=(39, 39))),
        RealModel(
            "warp-features-16ch-1x1",  # N x 16 x 1 x 1: NCHW and NHWC are the same bytes
            warp_then_features(16, out_size=(1, 1), batch=2, padding="border"),
        ),
        RealModel("nearest-batch2", nearest_batch_warp),
        RealModel("inputs-feed-two-ops", inputs_feed_two_ops),
        *conformance_cases(),
    )
}
