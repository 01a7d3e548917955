"""Models and graph inspection shared by etkit-quant's tests (on pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize

F32 = torch.float32


def f32(value: float) -> float:
    """``value`` rounded to float32, as a PT2E observer stores a scale."""
    return float(torch.tensor(value, dtype=F32))


def pixel_grid(height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


class GridFromInput(torch.nn.Module):
    """image and grid are model inputs."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return self.conv(F.grid_sample(image, grid, align_corners=False))


class FlowWarp(torch.nn.Module):
    """grid = pixel grid (meshgrid of linspace) + predicted flow; frame 0 warped, refined."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(6, 2, 3, padding=1)
        self.refine = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        flow = self.flow(torch.cat([frame0, frame1], 1)).permute(0, 2, 3, 1) * 0.1
        grid = pixel_grid(height, width) + flow
        warped = F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)
        return self.refine(warped)


class SpatialTransformer(torch.nn.Module):
    """A localization net predicts theta; affine_grid; grid_sample."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.theta = torch.nn.Linear(4, 6)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pooled = self.features(image).mean(dim=(2, 3))
        theta = self.theta(pooled).view(-1, 2, 3) * 0.1 + torch.tensor(
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
        )
        grid = F.affine_grid(theta, list(image.shape), align_corners=False)
        return F.grid_sample(image, grid, align_corners=False)


class TwoSamplersOneImage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)

    def forward(
        self, image: torch.Tensor, grid_a: torch.Tensor, grid_b: torch.Tensor
    ) -> torch.Tensor:
        features = self.conv(image)
        a = F.grid_sample(features, grid_a, align_corners=True)
        b = F.grid_sample(features, grid_b * 0.5, mode="nearest", align_corners=True)
        return a + b


class ChainedSamplers(torch.nn.Module):
    def forward(
        self, image: torch.Tensor, grid_a: torch.Tensor, grid_b: torch.Tensor
    ) -> torch.Tensor:
        first = F.grid_sample(image, grid_a, align_corners=False)
        return F.grid_sample(
            first, torch.tanh(grid_b), padding_mode="reflection", align_corners=False
        )


class SharedProducer(torch.nn.Module):
    """The flow conv feeds the grid and also other computation: it must stay quantized."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(3, 2, 3, padding=1)
        self.head = torch.nn.Conv2d(2, 1, 1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flow = self.flow(image)
        grid = pixel_grid(image.shape[2], image.shape[3]) + flow.permute(0, 2, 3, 1) * 0.1
        return F.grid_sample(image, grid, align_corners=False), self.head(flow)


class NoGridSampler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.conv2(torch.relu(self.conv1(image))), -1, 1)


class ManyInputsOutputs(torch.nn.Module):
    """Three inputs, three outputs, for mixes of qspecs and None."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_a = torch.nn.Conv2d(3, 3, 1)
        self.conv_b = torch.nn.Conv2d(3, 3, 1)

    def forward(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.conv_a(a) + self.conv_b(b)
        return x, torch.relu(x) * c, self.conv_b(c)


def rand(*shape: int, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    return torch.rand(*shape) * (high - low) + low


def call_nodes(gm: GraphModule, predicate: Callable[[Node], bool]) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and predicate(n)]


def qparams_of(node: Node) -> tuple[float, int, int, int, torch.dtype]:
    """(scale, zero_point, quant_min, quant_max, dtype) of a quantize/dequantize node."""
    assert is_quantize(node) or is_dequantize(node), node.format_node()
    scale, zero_point, quant_min, quant_max, dtype = node.args[1:6]
    return float(scale), int(zero_point), int(quant_min), int(quant_max), dtype  # type: ignore[arg-type]


def float_region(start: Node) -> set[Node]:
    """The nodes that compute ``start`` without passing through a dequantize: the region that
    runs in float."""
    region: set[Node] = set()
    stack = [start]
    while stack:
        node = stack.pop()
        if node in region or is_dequantize(node) or node.op != "call_function":
            continue
        region.add(node)
        stack.extend(a for a in node.all_input_nodes)
    return region


def grid_sample_nodes(gm: GraphModule) -> list[Node]:
    return call_nodes(gm, is_grid_sampler)


# -- values that cross a grid sampler; flows iterated and shared; correlation lookups -----------


def coords_grid(height: int, width: int) -> torch.Tensor:
    """Pixel coordinates (x, y), N x 2 x H x W, as RAFT and RIFE compute them in the model."""
    ys, xs = torch.meshgrid(
        torch.arange(height).float(), torch.arange(width).float(), indexing="ij"
    )
    return torch.stack([xs, ys], 0).unsqueeze(0)


def pixels_to_grid(coords: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """N x 2 x H x W pixel coordinates to an align_corners=True grid: 2 * x / (W - 1) - 1."""
    x, y = coords.permute(0, 2, 3, 1).split([1, 1], dim=-1)
    return torch.cat([2 * x / (width - 1) - 1, 2 * y / (height - 1) - 1], dim=-1)


class MaskedBlend(torch.nn.Module):
    """One head predicts the flow and a blend mask: ``warp(frame0) * mask + frame1 * (1 -
    mask)``; the mask is computed before the grid sampler and consumed after it."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Conv2d(6, 3, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        head = self.head(torch.cat([frame0, frame1], 1))
        grid = pixels_to_grid(coords_grid(height, width) + head[:, :2], height, width)
        mask = torch.sigmoid(head[:, 2:3])
        warped = F.grid_sample(frame0, grid, padding_mode="border", align_corners=True)
        return warped * mask + frame1 * (1 - mask)


class WarpConcatFeatures(torch.nn.Module):
    """Features warped by a flow predicted from them, concatenated with the features as they
    were before the grid sampler, fused."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.flow = torch.nn.Conv2d(8, 2, 3, padding=1)
        self.fuse = torch.nn.Conv2d(16, 3, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        _, _, height, width = image.shape
        features = torch.relu(self.features(image))
        grid = pixels_to_grid(coords_grid(height, width) + self.flow(features), height, width)
        warped = F.grid_sample(features, grid, align_corners=True)
        return self.fuse(torch.cat([warped, features], 1))


class ResidualWarp(torch.nn.Module):
    """``refined + grid_sample(refined, grid)``: the pre-sampler image added after it."""

    def __init__(self) -> None:
        super().__init__()
        self.refine = torch.nn.Conv2d(3, 3, 3, padding=1)
        self.flow = torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        _, _, height, width = image.shape
        refined = self.refine(image)
        grid = pixels_to_grid(coords_grid(height, width) + self.flow(refined), height, width)
        return refined + F.grid_sample(refined, grid, align_corners=True)


class IterativeFlow(torch.nn.Module):
    """RAFT's update loop in small: the flow starts at zero, each iteration samples the frame at
    ``coords + flow`` and adds an update computed from the sample and the flow, so the flow
    feeds a grid, the next update and the next flow at once."""

    def __init__(self, iterations: int = 2) -> None:
        super().__init__()
        self.iterations = iterations
        self.update = torch.nn.Conv2d(3 + 2, 2, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n, _, height, width = image.shape
        coords = coords_grid(height, width)
        flow = torch.zeros(n, 2, height, width)
        for _ in range(self.iterations):
            sampled = F.grid_sample(
                image, pixels_to_grid(coords + flow, height, width), align_corners=True
            )
            flow = flow + self.update(torch.cat([sampled, flow], 1))
        return flow


class CorrelationLookup(torch.nn.Module):
    """RAFT's ``CorrBlock`` in small: one encoder applied to both frames (shared weights), the
    all-pairs correlation volume as a batch of h*w one-channel maps, average-pooled into a
    pyramid, each level sampled (align_corners=True) at coords + predicted flow + a (2r+1)^2
    window normalized by 2 * x / (W - 1) - 1 (reaching past [-1, 1]), the levels concatenated
    and read by a head. Outputs: the head's result and the flow."""

    def __init__(self, levels: int = 2, radius: int = 1, dim: int = 8) -> None:
        super().__init__()
        self.levels, self.radius = levels, radius
        self.encoder = torch.nn.Conv2d(3, dim, 3, stride=2, padding=1)
        self.flow = torch.nn.Conv2d(dim, 2, 3, padding=1)
        self.head = torch.nn.Conv2d(levels * (2 * radius + 1) ** 2, 4, 1)

    def forward(
        self, frame0: torch.Tensor, frame1: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features0, features1 = self.encoder(frame0), self.encoder(frame1)
        n, c, h, w = features0.shape
        volume = torch.matmul(
            features0.view(n, c, h * w).transpose(1, 2), features1.view(n, c, h * w)
        ) / (c**0.5)
        pyramid = [volume.reshape(n * h * w, 1, h, w)]
        for _ in range(self.levels - 1):
            pyramid.append(F.avg_pool2d(pyramid[-1], 2, stride=2))
        flow = self.flow(features0)
        centre = (coords_grid(h, w) + flow).permute(0, 2, 3, 1).reshape(n * h * w, 1, 1, 2)
        r = self.radius
        steps = torch.linspace(-r, r, 2 * r + 1)
        window = torch.stack(torch.meshgrid(steps, steps, indexing="ij"), -1).flip(-1)
        looked_up = []
        for level, volume_level in enumerate(pyramid):
            xy = centre / 2**level + window.view(1, 2 * r + 1, 2 * r + 1, 2)
            height, width = volume_level.shape[-2:]
            x, y = xy.split([1, 1], dim=-1)
            grid = torch.cat([2 * x / (width - 1) - 1, 2 * y / (height - 1) - 1], dim=-1)
            sampled = F.grid_sample(volume_level, grid, align_corners=True)
            looked_up.append(sampled.view(n, h, w, -1))
        correlation = torch.cat(looked_up, dim=-1).permute(0, 3, 1, 2)
        return self.head(correlation), flow


def mixed_quantized_inputs(gm: GraphModule) -> list[str]:
    """Ops the Arm backend will lower as quantized (``ArmAnnotationInfo``) whose tensor inputs
    mix dequantized integers and plain floats: what its lowering cannot rescale ("Expected two
    input qparams")."""
    mixed = []
    for node in call_nodes(gm, lambda n: not (is_quantize(n) or is_dequantize(n))):
        info = node.meta.get("custom", {}).get("_arm_annotation_info")
        if not info or not info["quantized"]:
            continue
        tensors = [
            a
            for a in node.all_input_nodes
            if a.op != "get_attr" and isinstance(a.meta.get("val"), torch.Tensor)
        ]
        dequantized = [is_dequantize(a) for a in tensors]
        if any(dequantized) and not all(dequantized):
            mixed.append(node.name)
    return mixed


# -- models whose network exists to predict the grid: only the coordinate arithmetic is float --


def warp_by_pixels(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """RIFE's backward warp: ``flow`` (N x 2 x H x W, pixels) over the align_corners=True grid."""
    _, _, height, width = flow.shape
    grid = pixel_grid(height, width).permute(0, 3, 1, 2)
    scale = torch.tensor([(width - 1) / 2, (height - 1) / 2]).view(1, 2, 1, 1)
    positions = (grid + flow / scale).permute(0, 2, 3, 1)
    return F.grid_sample(image, positions, padding_mode="border", align_corners=True)


class FlowEstimator(torch.nn.Module):
    """Three convs predict a flow in pixels from two frames; frame 0 is warped by it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(6, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 3, padding=1),
        )
        with torch.no_grad():
            self.net[4].weight.mul_(8.0)  # flows of a few pixels

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        return warp_by_pixels(frame0, self.net(torch.cat([frame0, frame1], 1)))


class STNClassifier(torch.nn.Module):
    """The PyTorch spatial-transformer tutorial in small: localization convs, pooling, two
    linear layers predict theta; affine_grid; grid_sample; a conv and a linear classify."""

    def __init__(self) -> None:
        super().__init__()
        self.localization = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 5),
            torch.nn.MaxPool2d(2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(4, 4, 3),
            torch.nn.MaxPool2d(2),
            torch.nn.ReLU(),
        )
        self.fc_loc = torch.nn.Sequential(
            torch.nn.Linear(4 * 2 * 2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6)
        )
        with torch.no_grad():
            self.fc_loc[2].weight.mul_(0.1)
            self.fc_loc[2].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
        self.conv = torch.nn.Conv2d(1, 4, 3, stride=2)
        self.head = torch.nn.Linear(4 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.fc_loc(self.localization(x).flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        warped = F.grid_sample(x, grid, align_corners=False)
        return self.head(torch.relu(self.conv(warped)).flatten(1))


class RIFEShaped(torch.nn.Module):
    """RIFE's shape: an encoder on both frames, a flow head (two flows, pixels, at half
    resolution, interpolated up) and a separate mask head; both frames backward-warped and
    blended by the sigmoid mask."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = torch.nn.Sequential(torch.nn.Conv2d(6, 8, 3, 2, 1), torch.nn.LeakyReLU(0.2))
        self.flow_head = torch.nn.Conv2d(8, 4, 3, 1, 1)
        self.mask_head = torch.nn.Conv2d(8, 1, 3, 1, 1)
        with torch.no_grad():
            self.flow_head.weight.mul_(4.0)

    def forward(self, img0: torch.Tensor, img1: torch.Tensor) -> torch.Tensor:
        features = self.encode(torch.cat([img0, img1], 1))
        flow = F.interpolate(self.flow_head(features), scale_factor=2.0, mode="bilinear") * 2
        mask = torch.sigmoid(F.interpolate(self.mask_head(features), scale_factor=2.0))
        warped0 = warp_by_pixels(img0, flow[:, :2])
        warped1 = warp_by_pixels(img1, flow[:, 2:4])
        return warped0 * mask + warped1 * (1 - mask)


class RAFTShaped(torch.nn.Module):
    """RAFT's shape, warp form: shared feature convs, the all-pairs correlation (a matmul), a
    lookup in it (grid_sample at coords + flow), an update conv, the flow upsampled and frame 1
    backward-warped by it (the only output)."""

    def __init__(self) -> None:
        super().__init__()
        self.fnet = torch.nn.Conv2d(3, 8, 3, 4, 1)
        self.update = torch.nn.Sequential(
            torch.nn.Conv2d(1 + 2, 8, 3, 1, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 3, 1, 1)
        )

    def forward(self, image1: torch.Tensor, image2: torch.Tensor) -> torch.Tensor:
        f1, f2 = self.fnet(image1), self.fnet(image2)
        n, c, h, w = f1.shape
        corr = torch.matmul(f1.view(n, c, h * w).transpose(1, 2), f2.view(n, c, h * w))
        corr = corr.view(n * h * w, 1, h, w) / c**0.5
        coords = coords_grid(h, w)
        flow = torch.zeros(n, 2, h, w)
        for _ in range(2):
            centre = (coords + flow).permute(0, 2, 3, 1).reshape(n * h * w, 1, 1, 2)
            grid = torch.cat(
                [2 * centre[..., :1] / (w - 1) - 1, 2 * centre[..., 1:] / (h - 1) - 1], -1
            )
            looked = F.grid_sample(corr, grid, align_corners=True).view(n, 1, h, w)
            flow = flow + self.update(torch.cat([looked, flow], 1))
        flow_up = 4 * F.interpolate(flow, scale_factor=4, mode="bilinear", align_corners=True)
        return warp_by_pixels(image2, flow_up)


class CopiedGrid(torch.nn.Module):
    """Coordinates written into a buffer in place (``copy_`` into slices, as kornia does), a
    ``.to()`` (torch.export writes ``_assert_tensor_metadata``) and a 0-dim constant."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(3, 2, 3, padding=1)
        self.register_buffer("gain", torch.tensor(0.5))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n, _, height, width = image.shape
        flow = self.flow(image).to(torch.float32)
        base = pixel_grid(height, width)
        grid = torch.zeros(n, height, width, 2)
        grid[..., 0].copy_(base[..., 0] + flow[:, 0] * self.gain)
        grid[..., 1].copy_(base[..., 1] + flow[:, 1] * self.gain)
        return F.grid_sample(image, grid, align_corners=False)
