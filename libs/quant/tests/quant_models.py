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
