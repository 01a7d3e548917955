"""Built-in demo models: deterministic weights from a fixed seed, no downloads. Each factory
returns the module and example inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

DemoFactory = Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


def pixel_grid(height: int, width: int) -> torch.Tensor:
    """The identity sampling grid, 1 x height x width x 2 (align_corners=True convention)."""
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


class FlowWarp(torch.nn.Module):
    """Frame interpolation's shape: two RGB frames -> a small conv net predicting flow ->
    grid = pixel grid + flow -> frame 0 warped by grid_sample -> a refining conv -> RGB."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Sequential(
            torch.nn.Conv2d(6, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 2, 3, padding=1),
        )
        self.refine = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        flow = torch.tanh(self.flow(torch.cat([frame0, frame1], 1))) * 0.1
        grid = pixel_grid(height, width) + flow.permute(0, 2, 3, 1)
        warped = F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)
        return torch.clamp(self.refine(warped) + warped, -1, 1)


class AnySizeFlowWarp(FlowWarp):
    """The flow-warp demo with its base grid built from the input's batch, height and width in
    tensor ops (N x H x W per coordinate), as size-agnostic warps are written: a model that
    trains on any batch and crop (QAT on crops; examples/qat_torchrun.py)."""

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        n, _, height, width = frame0.shape
        flow = torch.tanh(self.flow(torch.cat([frame0, frame1], 1))) * 0.1
        ys = torch.arange(height, dtype=torch.float32) * 2 / (height - 1) - 1
        xs = torch.arange(width, dtype=torch.float32) * 2 / (width - 1) - 1
        base = torch.stack(
            (
                xs.view(1, 1, -1).expand(n, height, width),
                ys.view(1, -1, 1).expand(n, height, width),
            ),
            -1,
        )
        warped = F.grid_sample(
            frame0, base + flow.permute(0, 2, 3, 1), padding_mode="border", align_corners=False
        )
        return torch.clamp(self.refine(warped) + warped, -1, 1)


class SpatialTransformer(torch.nn.Module):
    """A localization net -> affine_grid -> grid_sample."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(4, 8, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, stride=2, padding=1),
        )
        self.theta = torch.nn.Linear(8, 6)
        self.register_buffer("identity", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pooled = self.features(image).mean(dim=(2, 3))
        theta = self.theta(pooled).view(-1, 2, 3) * 0.1 + self.identity
        grid = F.affine_grid(theta, list(image.shape), align_corners=False)
        return F.grid_sample(image, grid, align_corners=False)


class Resample(torch.nn.Module):
    """An RGBA image and an externally supplied grid as inputs; the resampled image and a
    nearest-neighbour version of it as two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = torch.nn.Conv2d(4, 4, 1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        smooth = F.grid_sample(image, grid, padding_mode="reflection", align_corners=False)
        sharp = F.grid_sample(image, grid, mode="nearest", padding_mode="zeros", align_corners=True)
        return torch.clamp(self.mix(smooth), -1, 1), sharp


def _seeded(module: torch.nn.Module) -> torch.nn.Module:
    return module.eval()


def flow_warp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = _seeded(FlowWarp())
    frames = (torch.rand(1, 3, 32, 48) * 2 - 1, torch.rand(1, 3, 32, 48) * 2 - 1)
    return model, frames


def stn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    model = _seeded(SpatialTransformer())
    return model, (torch.rand(1, 4, 32, 32) * 2 - 1,)


def resample() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(2)
    model = _seeded(Resample())
    grid = pixel_grid(24, 40) * 0.9 + (torch.rand(1, 24, 40, 2) - 0.5) * 0.05
    return model, (torch.rand(1, 4, 32, 48) * 2 - 1, grid)


class TemporalAccumulator(torch.nn.Module):
    """A recurrent model written the usual way (temporal anti-aliasing, denoising): a registered
    ``history``, reprojected by a flow a small conv net predicts from the frame and the history,
    blended with the frame, written back with ``copy_``; the output is the new history. etkit
    lifts the buffer into a state pair (``export.state``)."""

    def __init__(self, height: int = 32, width: int = 48, channels: int = 3) -> None:
        super().__init__()
        self.register_buffer("history", torch.zeros(1, channels, height, width))
        self.flow = torch.nn.Sequential(
            torch.nn.Conv2d(2 * channels, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 3, padding=1),
        )
        self.blend = 0.8  # the history's weight

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame.shape
        history: torch.Tensor = self.history  # type: ignore[assignment]
        flow = torch.tanh(self.flow(torch.cat([frame, history], 1))) * 0.05
        grid = pixel_grid(height, width) + flow.permute(0, 2, 3, 1)
        warped = F.grid_sample(history, grid, padding_mode="border", align_corners=True)
        out = self.blend * warped + (1 - self.blend) * frame
        history.copy_(out)
        return out


def temporal_accumulator() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    model = _seeded(TemporalAccumulator()).eval()
    (frame,) = moving_scene(1, 32, 48)[0]
    return model, (frame,)


def moving_scene(
    frames: int, height: int, width: int, *, channels: int = 3, seed: int = 0
) -> list[tuple[torch.Tensor]]:
    """A short video: a smooth random texture in [-1, 1] panning by about a pixel a frame, each
    frame a 1-tuple of a 1 x ``channels`` x ``height`` x ``width`` tensor (a sequence of the
    temporal accumulator's inputs)."""
    generator = torch.Generator().manual_seed(seed)
    big = torch.rand(
        1, channels, height // 4 + 4, width // 4 + 4 + frames // 4, generator=generator
    )
    texture = F.interpolate(big * 2 - 1, scale_factor=4, mode="bilinear", align_corners=False)
    return [(texture[..., 8 : 8 + height, t : t + width].contiguous(),) for t in range(frames)]


DEMOS: dict[str, DemoFactory] = {
    "flow-warp": flow_warp,
    "stn": stn,
    "resample": resample,
    "temporal-accumulator": temporal_accumulator,
}


def moving_textures(
    count: int,
    height: int = 32,
    width: int = 48,
    *,
    max_flow: float = 2.0,
    seed: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Training data for the flow-warp demo, with a known answer: ``count`` triples ``(frame0,
    frame1, flow)``, 1 x 3 x ``height`` x ``width`` frames in [-1, 1] of a smooth random texture
    (noise at 1/4 and 1/8 of the size, upsampled bicubically) and ``flow`` (1 x 2 x H x W, in
    pixels, x then y): a smooth random field up to ``max_flow`` pixels per axis (a translation
    plus a gentle variation). ``frame1`` is ``frame0`` warped by ``flow``: ``frame1[p] =
    frame0[p + flow[p]]`` (float ``grid_sample``, bilinear, border), so a model that warps
    ``frame0`` by the right flow reproduces ``frame1``."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(count):
        texture = torch.zeros(1, 3, height, width)
        for factor, weight in ((4, 0.7), (8, 0.5)):
            coarse = torch.randn(
                1, 3, max(height // factor, 2), max(width // factor, 2), generator=generator
            )
            texture += weight * F.interpolate(
                coarse, (height, width), mode="bicubic", align_corners=False
            )
        frame0 = torch.tanh(texture)
        shift = (torch.rand(1, 2, 1, 1, generator=generator) * 2 - 1) * 0.7 * max_flow
        coarse = (torch.rand(1, 2, 3, 4, generator=generator) * 2 - 1) * 0.3 * max_flow
        flow = shift + F.interpolate(coarse, (height, width), mode="bilinear", align_corners=True)
        scale = torch.tensor([2 / width, 2 / height]).view(1, 2, 1, 1)
        grid = pixel_grid_centres(height, width) + (flow * scale).permute(0, 2, 3, 1)
        frame1 = F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)
        samples.append((frame0, frame1, flow))
    return samples


def pixel_grid_centres(height: int, width: int) -> torch.Tensor:
    """The identity sampling grid of ``align_corners=False`` (pixel centres), 1 x H x W x 2."""
    ys = (torch.arange(height, dtype=torch.float32) * 2 + 1) / height - 1
    xs = (torch.arange(width, dtype=torch.float32) * 2 + 1) / width - 1
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)
