"""Models built on third-party libraries, as a new user writes them: kornia 0.9's warps (each
``kornia.geometry`` function that samples through ``grid_sample``) and torchvision's RAFT-small
optical flow (random weights: nothing is downloaded), at small sizes with realistic fixed
matrices, maps and inputs.

``THIRD_PARTY_MODELS`` maps a name to a ``Case``: ``make()`` gives the model and its example
inputs (seeded), ``targets`` the targets it exports for (a target left out has its one-line
reason, naming the upstream limit, in ``refused``).

torchvision: the only torchvision 0.28 wheel these machines can install is a CUDA build, whose
``_C`` extension fails to load against the CPU torch ("operator torchvision::nms does not
exist", pytorch/vision#9085). ``import_torchvision`` defines the two operator schemas that
torchvision's import registers fake kernels for (``torchvision::nms`` and ``torchvision::qnms``)
before importing it; RAFT calls no torchvision operator, only ``F.grid_sample`` and convolutions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

TARGETS = ("xnnpack", "vgf")
SIZE = (16, 20)  # H, W of the images: small, so the whole zoo exports in minutes


@dataclass(frozen=True)
class Case:
    """One model of the zoo."""

    make: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    library: str  # "kornia" or "torchvision"
    function: str  # the library function it exercises, as a user imports it
    refused: dict[str, str] = field(default_factory=dict)  # target -> why it is not exported
    slow: bool = False
    # the bar against the float model (tests/test_real_models.py's 38 dB for bilinear images)
    float_psnr_db: float = 38.0

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGETS if t not in self.refused)


def _image(seed: int, channels: int = 3, size: tuple[int, int] = SIZE) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # a smooth picture plus texture: bilinear sampling of it is not trivially exact
    h, w = size
    ys = torch.linspace(0, 1, h)[:, None]
    xs = torch.linspace(0, 1, w)[None, :]
    base = torch.stack(
        [torch.sin(3 * xs + 2 * ys + k) * 0.5 + 0.5 for k in range(channels)]
    ).expand(1, channels, h, w)
    return (0.8 * base + 0.2 * torch.rand(1, channels, h, w, generator=generator)).contiguous()


class _Call(torch.nn.Module):
    """``fn(image, *buffers, *extra_inputs, **kwargs)``: the fixed tensors (matrices, maps) are
    buffers, as a user's module holds them."""

    def __init__(self, fn: Callable[..., torch.Tensor], buffers: tuple[torch.Tensor, ...] = (),
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        self.fn = fn
        self.kwargs = kwargs
        self.count = len(buffers)
        for k, b in enumerate(buffers):
            self.register_buffer(f"fixed{k}", b)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        fixed = [getattr(self, f"fixed{k}") for k in range(self.count)]
        return self.fn(inputs[0], *fixed, *inputs[1:], **self.kwargs)


def _kornia() -> Any:
    import kornia

    return kornia


AFFINE = torch.tensor([[[0.92, -0.12, 2.3], [0.15, 0.88, -1.4]]])
PERSPECTIVE = torch.tensor([[[0.95, 0.08, 1.5], [-0.06, 1.02, -0.8], [0.004, -0.003, 1.0]]])


def _warp_affine(**kwargs: Any) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        k = _kornia()
        return _Call(k.geometry.transform.warp_affine, (AFFINE,), dsize=SIZE, **kwargs), (
            _image(1),
        )

    return make


def _warp_affine_matrix_input() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    model = _Call(lambda x, m: k.geometry.transform.warp_affine(x, m, SIZE))
    return model, (_image(2), AFFINE.clone())


def _warp_perspective() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.warp_perspective, (PERSPECTIVE,), dsize=SIZE), (_image(3),)


def _rotate() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.rotate, (torch.tensor([17.5]),)), (_image(4),)


def _translate() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.translate, (torch.tensor([[2.5, -1.25]]),)), (_image(5),)


def _scale() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.scale, (torch.tensor([[1.2, 0.9]]),)), (_image(6),)


def _shear() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.shear, (torch.tensor([[0.1, -0.15]]),)), (_image(7),)


def _affine() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.affine, (AFFINE,)), (_image(8),)


def _pixel_maps(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel coordinates of a gentle swirl over the image (B x H x W each)."""
    h, w = SIZE
    ys, xs = torch.meshgrid(torch.arange(h).float(), torch.arange(w).float(), indexing="ij")
    generator = torch.Generator().manual_seed(seed)
    jitter = 0.3 * torch.rand(2, h, w, generator=generator)
    angle = 0.15 * torch.sin(xs / w * math.pi)
    map_x = xs + 1.5 * torch.cos(angle) + jitter[0] - 0.7
    map_y = ys + 1.2 * torch.sin(angle * 3) + jitter[1] - 0.4
    return map_x[None], map_y[None]


def _normalized(map_x: torch.Tensor, map_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = SIZE
    return map_x * 2 / (w - 1) - 1, map_y * 2 / (h - 1) - 1


def _remap_normalized_inputs() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    model = _Call(k.geometry.transform.remap, align_corners=True, normalized_coordinates=True)
    return model, (_image(9), *_normalized(*_pixel_maps(9)))


def _remap_fixed_maps() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    model = _Call(k.geometry.transform.remap, _pixel_maps(10), align_corners=True)
    return model, (_image(10),)


def _remap_pixel_inputs() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    model = _Call(k.geometry.transform.remap, align_corners=True)
    return model, (_image(11), *_pixel_maps(11))


def _elastic(**kwargs: Any) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        k = _kornia()
        noise = torch.rand(1, 2, *SIZE, generator=torch.Generator().manual_seed(12)) * 2 - 1
        model = _Call(k.geometry.transform.elastic_transform2d, **kwargs)
        return model, (_image(12), noise)

    return make


def _tps() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    tr = k.geometry.transform
    points_src = torch.tensor([[[-0.8, -0.8], [0.8, -0.8], [0.8, 0.8], [-0.8, 0.8], [0.0, 0.0]]])
    points_dst = points_src + torch.tensor([[[0.05, 0.02], [-0.04, 0.06], [0.03, -0.05],
                                             [-0.02, -0.03], [0.06, 0.04]]])  # fmt: skip
    kernel_weights, affine_weights = tr.get_tps_transform(points_dst, points_src)
    model = _Call(tr.warp_image_tps, (points_src, kernel_weights, affine_weights))
    return model, (_image(13),)


def _warp_frame_depth() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    h, w = SIZE
    camera = torch.tensor([[[18.0, 0.0, w / 2], [0.0, 18.0, h / 2], [0.0, 0.0, 1.0]]])
    angle = 0.03
    pose = torch.tensor([[[math.cos(angle), 0.0, math.sin(angle), 0.08], [0.0, 1.0, 0.0, -0.05],
                          [-math.sin(angle), 0.0, math.cos(angle), 0.02],
                          [0.0, 0.0, 0.0, 1.0]]])  # fmt: skip
    depth = 2.0 + torch.rand(1, 1, h, w, generator=torch.Generator().manual_seed(14))
    model = _Call(
        lambda image, pose, camera, depth: k.geometry.depth.warp_frame_depth(
            image, depth, pose, camera
        ),
        (pose, camera),
    )
    return model, (_image(14), depth)


BOX = torch.tensor([[[2.0, 1.0], [15.0, 2.0], [14.0, 13.0], [1.0, 12.0]]])


def _crop_by_transform_mat() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    tr = k.geometry.transform
    dst = torch.tensor([[[0.0, 0.0], [11.0, 0.0], [11.0, 9.0], [0.0, 9.0]]])
    matrix = tr.get_perspective_transform(BOX, dst)
    return _Call(tr.crop_by_transform_mat, (matrix,), out_size=(10, 12)), (_image(15),)


def _crop_and_resize() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    return _Call(k.geometry.transform.crop_and_resize, (BOX,), size=(10, 12)), (_image(16),)


# A nearest sample moves by a whole pixel where the quantized grid crosses a rounding tie the
# float grid does not: measured 36.8 dB (elastic, VGF) and 53.8 dB (warp_affine).
NEAREST_FLOAT_PSNR_DB = 30.0
# The matrix given as an input is int8 by default (inputs that only feed coordinate arithmetic
# do not get int16 defaults yet): 35.4 dB measured on VGF.
MATRIX_INPUT_FLOAT_PSNR_DB = 32.0

KORNIA_MODELS: dict[str, Case] = {
    "warp_affine": Case(_warp_affine(), "kornia", "geometry.transform.warp_affine"),
    "warp_affine_nearest": Case(
        _warp_affine(mode="nearest"),
        "kornia",
        "geometry.transform.warp_affine",
        float_psnr_db=NEAREST_FLOAT_PSNR_DB,
    ),
    "warp_affine_border": Case(
        _warp_affine(padding_mode="border"), "kornia", "geometry.transform.warp_affine"
    ),
    "warp_affine_reflection": Case(
        _warp_affine(padding_mode="reflection", align_corners=False),
        "kornia",
        "geometry.transform.warp_affine",
    ),
    "warp_affine_matrix_input": Case(
        _warp_affine_matrix_input,
        "kornia",
        "geometry.transform.warp_affine",
        float_psnr_db=MATRIX_INPUT_FLOAT_PSNR_DB,
    ),
    "warp_perspective": Case(_warp_perspective, "kornia", "geometry.transform.warp_perspective"),
    "rotate": Case(_rotate, "kornia", "geometry.transform.rotate"),
    "translate": Case(_translate, "kornia", "geometry.transform.translate"),
    "scale": Case(_scale, "kornia", "geometry.transform.scale"),
    "shear": Case(_shear, "kornia", "geometry.transform.shear"),
    "affine": Case(_affine, "kornia", "geometry.transform.affine"),
    "remap_normalized_inputs": Case(_remap_normalized_inputs, "kornia", "geometry.transform.remap"),
    "remap_fixed_maps": Case(_remap_fixed_maps, "kornia", "geometry.transform.remap"),
    "remap_pixel_inputs": Case(_remap_pixel_inputs, "kornia", "geometry.transform.remap"),
    "elastic_transform2d": Case(
        _elastic(kernel_size=(5, 5), sigma=(2.0, 2.0), alpha=(2.0, 2.0)),
        "kornia",
        "geometry.transform.elastic_transform2d",
    ),
    "elastic_transform2d_nearest": Case(
        _elastic(kernel_size=(3, 3), sigma=(1.0, 1.5), alpha=(1.0, 1.0), mode="nearest"),
        "kornia",
        "geometry.transform.elastic_transform2d",
        float_psnr_db=NEAREST_FLOAT_PSNR_DB,
    ),
    "warp_image_tps": Case(_tps, "kornia", "geometry.transform.warp_image_tps"),
    "warp_frame_depth": Case(_warp_frame_depth, "kornia", "geometry.depth.warp_frame_depth"),
    "crop_by_transform_mat": Case(
        _crop_by_transform_mat, "kornia", "geometry.transform.crop_by_transform_mat"
    ),
    "crop_and_resize": Case(_crop_and_resize, "kornia", "geometry.transform.crop_and_resize"),
}


# -- torchvision -------------------------------------------------------------------------------


def import_torchvision() -> Any:
    """``torchvision``, importable beside the CPU torch (see the module's docstring)."""
    import sys

    if "torchvision" not in sys.modules and not hasattr(torch.ops.torchvision, "nms"):
        library = torch.library.Library("torchvision", "FRAGMENT")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(library)  # kept alive: dropping it removes the definitions
    import torchvision

    return torchvision


_LIBRARIES: list[Any] = []
RAFT_SIZE = (128, 128)  # the smallest RAFT takes: 4 correlation levels on features of 1/8 size
RAFT_UPDATES = 2


class RaftFlow(torch.nn.Module):
    """torchvision's RAFT-small: two frames in, the last flow estimate out."""

    def __init__(self, updates: int = RAFT_UPDATES) -> None:
        super().__init__()
        tv = import_torchvision()
        torch.manual_seed(0)
        self.raft = tv.models.optical_flow.raft_small(weights=None)
        self.updates = updates

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        flows = self.raft(frame0, frame1, num_flow_updates=self.updates)
        return flows[-1]  # type: ignore[no-any-return]


class RaftWarp(RaftFlow):
    """RAFT-small's flow warping frame 1 onto frame 0 (backward warping by the flow)."""

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        return _warp_by_flow(frame1, super().forward(frame0, frame1))


class RaftFlowAndWarp(RaftWarp):
    """Both forms in one model (one export): the flow and frame 1 warped by it."""

    def forward(  # type: ignore[override]
        self, frame0: torch.Tensor, frame1: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        flow = RaftFlow.forward(self, frame0, frame1)
        return flow, _warp_by_flow(frame1, flow)


def _warp_by_flow(frame: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    _, _, h, w = flow.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=flow.dtype), torch.arange(w, dtype=flow.dtype), indexing="ij"
    )
    gx = (xs + flow[:, 0]) * (2 / (w - 1)) - 1
    gy = (ys + flow[:, 1]) * (2 / (h - 1)) - 1
    grid = torch.stack([gx, gy], dim=-1)
    return torch.nn.functional.grid_sample(frame, grid, align_corners=True)


def raft_frames() -> tuple[torch.Tensor, torch.Tensor]:
    frame0 = _image(20, size=RAFT_SIZE) * 2 - 1  # RAFT takes images in [-1, 1]
    frame1 = torch.roll(frame0, shifts=(1, 2), dims=(2, 3))
    return frame0, frame1


def _raft(kind: type[RaftFlow]) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        return kind().eval(), raft_frames()

    return make


TORCHVISION_MODELS: dict[str, Case] = {
    "raft_small_flow": Case(
        _raft(RaftFlow), "torchvision", "models.optical_flow.raft_small", slow=True
    ),
    "raft_small_warp": Case(
        _raft(RaftWarp), "torchvision", "models.optical_flow.raft_small", slow=True
    ),
}

THIRD_PARTY_MODELS: dict[str, Case] = {**KORNIA_MODELS, **TORCHVISION_MODELS}


# -- kornia's own expectations -----------------------------------------------------------------
# Cases of kornia's unit tests that state their expected tensor explicitly (kornia's repository,
# tests/geometry/transform/, as of kornia 0.9; each cites its test). Images are given as
# N x C x H x W (kornia's tests also pass C x H x W); transforms are buffers of the model.
# Tolerances are the test's own, or kornia's default for float32 (testing/base.py: rtol 1e-4,
# atol 1e-5) where it gives none.

KORNIA_DEFAULT_RTOL, KORNIA_DEFAULT_ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Expectation:
    """One kornia unit-test case: the model and inputs, and the tensor the test expects."""

    make: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    expected: torch.Tensor
    source: str  # file::class::test in kornia's repository
    rtol: float = KORNIA_DEFAULT_RTOL
    atol: float = KORNIA_DEFAULT_ATOL


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)[None, None]


_EIGHT = _t([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
_ONES = torch.ones(1, 1, 4, 4)
_PATCH = torch.arange(1.0, 17.0).view(1, 1, 4, 4)


def _call(name: str, image: torch.Tensor, *fixed: torch.Tensor, **kwargs: Any) -> Callable[
    [], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]
]:  # fmt: skip
    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        k = _kornia()
        return _Call(getattr(k.geometry.transform, name), fixed, **kwargs), (image.clone(),)

    return make


def _affine_module() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    model = k.geometry.transform.Affine(
        angle=torch.tensor([180.0]), translation=torch.tensor([[1.0, 0.0]]), align_corners=True
    )
    image = _t([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0] * 4])
    return model.eval(), (image,)


def _shifted_arange(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    image = torch.arange(float(h * w)).view(1, 1, h, w)
    expected = torch.zeros_like(image)
    expected[..., 1:, 1:] = image[..., :2, :3]
    return image, expected


_ARANGE, _ARANGE_SHIFTED = _shifted_arange(3, 4)
_TRANSLATE_AFFINE = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]])
_TRANSLATE_HOMOGRAPHY = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]])


def _perspective_between(src: list[list[float]], dst: list[list[float]]) -> torch.Tensor:
    k = _kornia()
    return k.geometry.get_perspective_transform(
        torch.tensor([src], dtype=torch.float32), torch.tensor([dst], dtype=torch.float32)
    )  # type: ignore[no-any-return]


def _crop_center_resize() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    matrix = _perspective_between(
        [[1, 1], [1, 2], [2, 2], [2, 1]], [[0, 0], [0, 3], [3, 3], [3, 0]]
    )
    return _call("warp_perspective", _PATCH, matrix, dsize=(4, 4))()


def _crop_top_left() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    corners = [[0.0, 0.0], [0.0, 2.0], [2.0, 2.0], [2.0, 0.0]]
    matrix = _perspective_between(corners, corners)
    return _call("warp_perspective", _PATCH, matrix, dsize=(3, 3))()


def _remap_normalized() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    grid = k.geometry.create_meshgrid(3, 4, normalized_coordinates=True)
    model = _Call(k.geometry.transform.remap, align_corners=True, normalized_coordinates=True)
    return model, (torch.ones(1, 1, 3, 4), grid[..., 0].contiguous(), grid[..., 1].contiguous())


def _remap_shift() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    k = _kornia()
    grid = k.geometry.create_meshgrid(3, 4, normalized_coordinates=False) + 1.0
    model = _Call(k.geometry.transform.remap, align_corners=True)
    return model, (torch.ones(1, 1, 3, 4), grid[..., 0].contiguous(), grid[..., 1].contiguous())


_AFFINE_TESTS = "tests/geometry/transform/test_affine.py"
_IMGWARP_TESTS = "tests/geometry/transform/test_imgwarp.py"
KORNIA_EXPECTATIONS: dict[str, Expectation] = {
    "rotate_angle90": Expectation(
        _call("rotate", _EIGHT, torch.tensor([90.0]), align_corners=True),
        _t([[0.0, 0.0], [4.0, 6.0], [3.0, 5.0], [0.0, 0.0]]),
        f"{_AFFINE_TESTS}::TestRotate::test_angle90",
        1e-4,
        1e-4,
    ),
    "translate_dxdy": Expectation(
        _call("translate", _EIGHT, torch.tensor([[1.0, 0.0]]), align_corners=True),
        _t([[0.0, 1.0], [0.0, 3.0], [0.0, 5.0], [0.0, 7.0]]),
        f"{_AFFINE_TESTS}::TestTranslate::test_dxdy",
        1e-4,
        1e-4,
    ),
    "scale_factor_05": Expectation(
        _call("scale", _ONES, torch.tensor([[0.5, 0.5]])),
        _t([[0.0] * 4, [0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0] * 4]),
        f"{_AFFINE_TESTS}::TestScale::test_scale_factor_05",
        1e-4,
        1e-4,
    ),
    "affine_rotate_translate": Expectation(
        _affine_module,
        _t([[0.0] * 4, [0.0] * 4, [0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]]),
        f"{_AFFINE_TESTS}::TestAffine2d::test_affine_rotate_translate",
        1e-4,
        1e-4,
    ),
    "warp_affine_translation": Expectation(
        _call("warp_affine", _ARANGE, _TRANSLATE_AFFINE, dsize=(3, 4)),
        _ARANGE_SHIFTED,
        f"{_IMGWARP_TESTS}::TestWarpAffine::test_translation",
    ),
    "warp_perspective_translation": Expectation(
        _call("warp_perspective", _ARANGE, _TRANSLATE_HOMOGRAPHY, dsize=(3, 4)),
        _ARANGE_SHIFTED,
        f"{_IMGWARP_TESTS}::TestWarpPerspective::test_translation",
        1e-4,
        1e-4,
    ),
    "warp_perspective_convention": Expectation(
        _call(
            "warp_perspective",
            torch.arange(24.0).view(1, 1, 4, 6),
            torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]]),
            dsize=(3, 5),
            align_corners=True,
        ),
        _t([[0.0, 0.0, 1.0, 2.0, 3.0], [0.0, 6.0, 7.0, 8.0, 9.0], [0.0, 12.0, 13.0, 14.0, 15.0]]),
        f"{_IMGWARP_TESTS}::TestWarpPerspective::test_convention_normalize_invert_equivalence",
        1e-4,
        1e-4,
    ),
    "warp_perspective_crop_center_resize": Expectation(
        _crop_center_resize,
        _t(
            [
                [6.0, 6.3333, 6.6667, 7.0],
                [7.3333, 7.6667, 8.0, 8.3333],
                [8.6667, 9.0, 9.3333, 9.6667],
                [10.0, 10.3333, 10.6667, 11.0],
            ]
        ),
        f"{_IMGWARP_TESTS}::TestWarpPerspective::test_crop_center_resize",
    ),
    "warp_perspective_crop": Expectation(
        _crop_top_left,
        _PATCH[..., :3, :3].clone(),
        f"{_IMGWARP_TESTS}::TestWarpPerspective::test_crop",
    ),
    "remap_shift": Expectation(
        _remap_shift,
        _t([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
        f"{_IMGWARP_TESTS}::TestRemap::test_shift",
        1e-4,
        1e-4,
    ),
    "remap_normalized_coordinates": Expectation(
        _remap_normalized,
        torch.ones(1, 1, 3, 4),
        f"{_IMGWARP_TESTS}::TestRemap::test_normalized_coordinates",
        1e-4,
        1e-4,
    ),
    "warp_affine_singleton_identity": Expectation(
        _call("warp_affine", _ARANGE, torch.eye(2, 3)[None], dsize=(3, 1), align_corners=True),
        _t([[0.0], [4.0], [8.0]]),
        f"{_IMGWARP_TESTS}::TestWarpAffine::test_singleton_identity_agrees_with_perspective",
    ),
}
