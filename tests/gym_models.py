"""Arm's Neural Graphics Model Gym networks (``ng-model-gym`` 0.4.0), built from the gym's own
classes and configs at small sizes, with deterministic weights and inputs in the gym's ranges.

``GYM_MODELS`` maps a name to a ``GymCase``: ``make()`` gives the model and its example inputs
(seeded; the global RNG is left as it was). The gym's Slang pre- and post-processing needs CUDA,
so the NSS frame is the gym's one-frame step written as its shaders compute it in PyTorch: the
history reprojected by the motion vectors with the gym's ``DenseWarp`` (Catmull-Rom, the HIGH
quality preset's history filter), the gym's Karis tonemap (a maximum over channels), the gym's
``AutoEncoderV1`` and the temporal blend of its output parameters. The NFRU frame is the gym's
``NFRUAutoEncoder`` between two ``DenseWarp`` reprojections of the neighbouring frames, blended by
the gym's softmax of its coefficients. The autoencoders alone are what the gym's own export flow
exports (``BaseNGModel.get_neural_network``).

Motion vectors and flows are in pixels, as the gym's datasets hold them (several pixels, well
beyond [-1, 1]); linear HDR colours span [0, 4); tonemapped images [0, 1]; the BlockMatch warp's
search images [0, 255] (the gym's uint8 pyramid levels, cast to float before its warp).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

TARGETS = ("xnnpack", "vgf")
SIZE = (16, 16)  # H, W at low resolution: the autoencoders need multiples of 8
Made = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]


def gym_installed() -> bool:
    return importlib.util.find_spec("ng_model_gym") is not None


@dataclass(frozen=True)
class GymCase:
    """One network of the gym zoo."""

    make: Callable[[], Made]
    gym_class: str  # the gym class (or function) it is built from, as a user imports it
    gathers: bool = False  # written as index gathers, not grid_sample
    motion_inputs: tuple[int, ...] = ()  # indices of the inputs that are motion vectors (pixels)


def _seeded(seed: int, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build()
        for module in model.modules():
            # weights that keep the activations' spread through the depth, as trained ones do
            # (PyTorch's default init shrinks them layer by layer: near-constant outputs)
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    torch.nn.init.uniform_(module.bias, -0.1, 0.1)
            if isinstance(module, torch.nn.BatchNorm2d):  # running statistics of a trained one
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.8, 1.2)
    return model.eval()


def _rand(seed: int, *shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(*shape, generator=generator)


def _image(seed: int, channels: int, size: tuple[int, int], peak: float = 1.0) -> torch.Tensor:
    """A smooth picture plus texture, in [0, peak)."""
    h, w = size
    ys = torch.linspace(0, 1, h)[:, None]
    xs = torch.linspace(0, 1, w)[None, :]
    base = torch.stack([torch.sin(3 * xs + 2 * ys + k) * 0.5 + 0.5 for k in range(channels)])
    texture = _rand(seed, 1, channels, h, w)
    return (peak * (0.8 * base.expand(1, channels, h, w) + 0.2 * texture)).contiguous()


def _motion(seed: int, size: tuple[int, int], pixels: float) -> torch.Tensor:
    """A smooth motion field in pixels, (y, x) channels as the gym's ``DenseWarp`` reads them:
    a pan plus a swirl, up to about ``pixels``."""
    h, w = size
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    jitter = _rand(seed, 2, h, w, low=-0.25, high=0.25)
    dy = pixels * (0.45 + 0.35 * xs) + jitter[0]
    dx = pixels * (-0.3 + 0.5 * torch.sin(2.5 * ys)) + jitter[1]
    return torch.stack([dy, dx])[None].contiguous()


# -- DenseWarp: each mode as the gym's layer computes it ------------------------------------------


class DenseWarpCall(torch.nn.Module):
    """The gym's ``DenseWarp`` layer (it takes a list [frame, flow])."""

    def __init__(self, interpolation: str) -> None:
        super().__init__()
        from ng_model_gym.core.model.layers.dense_warp import DenseWarp

        self.warp = DenseWarp(interpolation=interpolation)

    def forward(self, frame: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        return self.warp([frame, flow])


class NearestViaGridSample(torch.nn.Module):
    """Nearest warping through the gym's ``dense_image_warp`` (its ``grid_sample`` form)."""

    def forward(self, frame: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        from ng_model_gym.core.model.dense_warp_utils import dense_image_warp

        return dense_image_warp(frame, flow, interpolation="nearest")


class CatmullViaGridSample(torch.nn.Module):
    """The gym's Catmull-Rom warp with its five bilinear taps through the gym's ``resampler``
    (``grid_sample``, border) instead of ``sample_bilinear``'s index gathers: the gym's
    ``catmull_rom_params`` and weights, as ``catmull_rom_warp`` combines them."""

    def forward(self, frame: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        from ng_model_gym.core.model.dense_warp_utils import catmull_rom_params, resampler

        _, _, h, w = frame.shape
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        query = torch.stack([ys, xs]).to(flow.dtype)[None] + 0.5 - flow  # (i, j) pixel edges
        s0, s1, s2, w0, w1, w2 = catmull_rom_params(query)
        taps = [(s1[:, 0], s0[:, 1]), (s0[:, 0], s1[:, 1]), (s1[:, 0], s1[:, 1])]
        taps += [(s2[:, 0], s1[:, 1]), (s1[:, 0], s2[:, 1])]
        weights = [w1[:, 0] * w0[:, 1], w0[:, 0] * w1[:, 1], w1[:, 0] * w1[:, 1]]
        weights += [w2[:, 0] * w1[:, 1], w1[:, 0] * w2[:, 1]]
        total = torch.zeros_like(frame)
        for (i, j), weight in zip(taps, weights, strict=True):
            # resampler samples pixel index warp (centres at integers); the taps are at edges
            warp = torch.stack([j - 0.5, i - 0.5], dim=1)
            total = total + resampler(frame, warp, clamp_to_edge=True) * weight[:, None]
        norm = torch.reciprocal(sum(weights, torch.zeros_like(weights[0])) + 1e-7)[:, None]
        return torch.maximum(total * norm, torch.tensor(0.0))


def _dense_warp(mode: str, seed: int) -> Callable[[], Made]:
    def make() -> Made:
        model = DenseWarpCall(mode) if mode in _GYM_MODES else _VARIANTS[mode]()
        return model.eval(), (_image(seed, 3, SIZE), _motion(seed, SIZE, 3.0))

    return make


_GYM_MODES = ("bilinear", "bilinear_oob_zero", "nearest", "nearest_oob_zero", "catmull")
_VARIANTS: dict[str, Callable[[], torch.nn.Module]] = {
    "nearest_grid_sample": NearestViaGridSample,
    "catmull_grid_sample": CatmullViaGridSample,
}


# -- BlockMatch's warp -------------------------------------------------------------------------


class BlockMatchWarp(torch.nn.Module):
    """BlockMatch v3.2.1's pyramid warp (``CalculateFlow._warp_bilinear``, from the gym's default
    ``BlockMatchV321Config``): a search level (uint8 values as float) warped by the upscaled
    vectors of the level above."""

    def __init__(self) -> None:
        super().__init__()
        from ng_model_gym.usecases.nfru.model.optical_flow.blockmatch_v321 import (
            BlockMatchV321,
            BlockMatchV321Config,
        )

        self.warp = BlockMatchV321(BlockMatchV321Config()).calc_flow._warp_bilinear

    def forward(self, search: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        return self.warp([search, vectors])


def _blockmatch_warp() -> Made:
    search = torch.round(255 * _image(31, 1, SIZE))
    return BlockMatchWarp().eval(), (search, _motion(31, SIZE, 4.0))


# -- NSS v1 ------------------------------------------------------------------------------------


def _nss_settings() -> Any:
    from ng_model_gym.usecases.nss.model.quality_modes import (
        NSSV1QualitySettings,
        resolve_nss_v1_quality,
    )

    return NSSV1QualitySettings.preset(resolve_nss_v1_quality(None))  # the gym's default: HIGH


def _nss_autoencoder_module() -> torch.nn.Module:
    from ng_model_gym.usecases.nss.model.model_blocks_v1 import AutoEncoderV1

    return AutoEncoderV1(batch_norm=False, kpn_size=_nss_settings().kpn_size)


def _nss_autoencoder() -> Made:
    """The network the gym's own flow exports: 12 preprocessed channels in [0, 1]."""
    return _seeded(11, _nss_autoencoder_module), (_rand(12, 1, 12, *SIZE),)


class NSSFrame(torch.nn.Module):
    """One NSS v1 frame (2x upscaling) with its history reprojection: the previous output
    (high resolution, linear HDR) reprojected by the low-resolution motion vectors (pixels)
    through the gym's ``DenseWarp`` (Catmull-Rom where the quality preset says so), averaged to
    low resolution (the shader's 2x2 history average), tonemapped with the gym's Karis
    tonemap (its maximum over channels) beside the current colour, the feedback and the
    colour/history difference: the autoencoder's 12 channels. Its temporal parameters blend
    the upsampled colour with the reprojected history: the new output and the history of the
    next frame, with the feedback."""

    def __init__(self) -> None:
        super().__init__()
        from ng_model_gym.core.model.layers.dense_warp import DenseWarp

        settings = _nss_settings()
        self.warp = DenseWarp("catmull" if settings.use_history_catmull else "bilinear")
        self.autoencoder = _nss_autoencoder_module()

    @staticmethod
    def _tonemap(x: torch.Tensor) -> torch.Tensor:
        from ng_model_gym.core.data.data_utils import tonemap_forward
        from ng_model_gym.core.utils.enum_definitions import ToneMapperMode

        return tonemap_forward(x, mode=ToneMapperMode.KARIS)

    def forward(
        self,
        colour: torch.Tensor,  # 1x3xhxw linear HDR
        history: torch.Tensor,  # 1x3x2hx2w linear HDR, the previous output
        motion: torch.Tensor,  # 1x2xhxw pixels at low resolution, (y, x)
        feedback: torch.Tensor,  # 1x4xhxw the previous temporal parameters
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        motion_hr = torch.nn.functional.interpolate(motion, scale_factor=2.0, mode="nearest") * 2
        warped = self.warp([history, motion_hr])
        warped_lr = torch.nn.functional.avg_pool2d(warped, 2)
        history_tm = self._tonemap(warped_lr)
        colour_tm = self._tonemap(colour)
        difference = torch.amax(torch.abs(colour_tm - history_tm), dim=1, keepdim=True)
        features = [history_tm, colour_tm, difference, feedback, 1.0 - difference]
        _, temporal = self.autoencoder(torch.cat(features, dim=1))
        alpha = torch.nn.functional.interpolate(temporal[:, :1], scale_factor=2.0)
        upsampled = torch.nn.functional.interpolate(colour, scale_factor=2.0, mode="nearest")
        output = alpha * upsampled + (1.0 - alpha) * warped
        return self._tonemap(output), output, temporal


def _nss_frame() -> Made:
    h, w = SIZE
    inputs = (
        _image(21, 3, SIZE, peak=4.0),
        _image(22, 3, (2 * h, 2 * w), peak=4.0),
        _motion(23, SIZE, 2.5),
        _rand(24, 1, 4, h, w),
    )
    return _seeded(25, NSSFrame), inputs


# -- NFRU v1 -----------------------------------------------------------------------------------


def _nfru_autoencoder_module() -> torch.nn.Module:
    from ng_model_gym.usecases.nfru.model.nfru_v1_nn import NFRUAutoEncoder

    return NFRUAutoEncoder()


def _nfru_autoencoder() -> Made:
    """The network the gym's own flow exports: 16 preprocessed channels in [0, 1]."""
    return _seeded(41, _nfru_autoencoder_module), (_rand(42, 1, 16, *SIZE),)


class NFRUFrame(torch.nn.Module):
    """One NFRU v1 interpolated frame at t = 0.5: both tonemapped neighbours warped to t by the
    gym's ``DenseWarp`` (bilinear) along the flow (pixels), the gym's ``NFRUAutoEncoder`` on
    them and their difference, and the gym's softmax of its coefficients blending the two."""

    def __init__(self) -> None:
        super().__init__()
        from ng_model_gym.core.model.layers.dense_warp import DenseWarp

        self.warp = DenseWarp("bilinear")
        self.auto_encoder = _nfru_autoencoder_module()
        self.coeff_softmax = torch.nn.Softmax(dim=1)  # as NFRUv1Core

    def forward(
        self, rgb_m1: torch.Tensor, rgb_p1: torch.Tensor, flow: torch.Tensor
    ) -> torch.Tensor:
        warped_m1 = self.warp([rgb_m1, flow * 0.5])
        warped_p1 = self.warp([rgb_p1, flow * -0.5])
        difference = torch.abs(warped_m1 - warped_p1)
        features = [warped_m1, warped_p1, difference, flow * 0.125, rgb_m1, rgb_p1[:, :2]]
        coeffs = self.coeff_softmax(self.auto_encoder(torch.cat(features, dim=1)))
        return coeffs[:, :1] * warped_m1 + coeffs[:, 1:2] * warped_p1


def _nfru_frame() -> Made:
    inputs = (_image(51, 3, SIZE), _image(52, 3, SIZE), _motion(53, SIZE, 4.0))
    return _seeded(54, NFRUFrame), inputs


GYM_MODELS: dict[str, GymCase] = {
    **{
        f"dense_warp_{mode}": GymCase(
            _dense_warp(mode, 1 + k),
            "DenseWarp" if mode in _GYM_MODES else "dense_warp_utils",
            gathers=(mode.startswith("nearest") and mode != "nearest_grid_sample")
            or mode == "catmull",
            motion_inputs=(1,),
        )
        for k, mode in enumerate([*_GYM_MODES, *_VARIANTS])
    },
    "blockmatch_warp": GymCase(_blockmatch_warp, "BlockMatchV321", motion_inputs=(1,)),
    "nss_autoencoder": GymCase(_nss_autoencoder, "AutoEncoderV1"),
    "nss_frame": GymCase(_nss_frame, "AutoEncoderV1", gathers=True, motion_inputs=(2,)),
    "nfru_autoencoder": GymCase(_nfru_autoencoder, "NFRUAutoEncoder"),
    "nfru_frame": GymCase(_nfru_frame, "NFRUAutoEncoder", motion_inputs=(2,)),
}
