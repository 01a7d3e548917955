"""The exact sampler in a module ``etkit_quant.prepare_qat`` returned (``qat.use_exact_samplers``):
its eval forward at every grid sampler is the C++ kernel on the same integers, before training and
after (an observed image quantization followed as it moves); what it cannot mirror is refused in
one line naming the sampler, before anything is replaced."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers quantized_decomposed)
from torchao.quantization.pt2e.fake_quantize import FixedQParamsFakeQuantize
from torchao.quantization.pt2e.observer import FixedQParamsObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_gridsampler import GridSampleOp, QParams, cpu, qat
from etkit_gridsampler.plan import UnsupportedOpError
from etkit_quant import (
    BoundaryQuantizer,
    QatGraphModule,
    convert_qat,
    observed_int8,
    prepare_qat,
    prepared_grid_samplers,
    snorm8,
)

H, W = 12, 20


def pixel_grid(height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


class TwoSamplers(torch.nn.Module):
    """A flow predicted from two frames warps frame 0 twice: bilinear with border padding, and
    nearest with zeros and aligned corners; a conv mixes the two."""

    def __init__(self, mode: str = "nearest") -> None:
        super().__init__()
        self.mode = mode
        self.flow = torch.nn.Sequential(
            torch.nn.Conv2d(6, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 3, padding=1),
        )
        self.mix = torch.nn.Conv2d(6, 3, 1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        flow = torch.tanh(self.flow(torch.cat([frame0, frame1], 1))) * 0.2
        grid = pixel_grid(H, W) + flow.permute(0, 2, 3, 1)
        smooth = F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)
        sharp = F.grid_sample(
            frame1, grid * 0.9, mode=self.mode, padding_mode="zeros", align_corners=True
        )
        return torch.clamp(self.mix(torch.cat([smooth, sharp], 1)), -1, 1)


def frames(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(1, 3, H, W, generator=generator) * 2 - 1,
         torch.rand(1, 3, H, W, generator=generator) * 2 - 1)
        for _ in range(count)
    ]  # fmt: skip


def prepared_model(
    model: torch.nn.Module | None = None, **sampler_qspecs: QuantizationSpec | None
) -> QatGraphModule:
    base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
    quantizer = BoundaryQuantizer(
        base, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),), **sampler_qspecs
    )
    torch.manual_seed(0)
    samples = frames(1, 2)
    return prepare_qat(model or TwoSamplers(), samples[0], quantizer, calibration=samples)


def program_quantize(values: torch.Tensor, q: QParams) -> torch.Tensor:
    return torch.ops.quantized_decomposed.quantize_per_tensor(
        values, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
    )


def program_dequantize(values: torch.Tensor, q: QParams) -> torch.Tensor:
    return torch.ops.quantized_decomposed.dequantize_per_tensor(
        values, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
    )


def check_samplers_are_the_kernel(
    prepared: QatGraphModule, inputs: list[tuple[torch.Tensor, ...]]
) -> int:
    """Runs ``prepared``'s eval forward on ``inputs`` and holds each sampler's output to the C++
    kernel on the integers the program's quantize makes of what the sampler read (0 steps).
    Returns the number of sampler calls compared."""
    calls: list[tuple[qat.PreparedGridSample, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    hooks = []
    for module in prepared.modules():
        if isinstance(module, qat.PreparedGridSample):
            hooks.append(module.register_forward_hook(
                lambda m, args, out: calls.append((m, args[0], args[1], out))  # type: ignore[arg-type]
            ))  # fmt: skip
    prepared.eval()
    with torch.no_grad():
        for sample in inputs:
            prepared(*sample)
    for hook in hooks:
        hook.remove()
    for module, image, grid, out in calls:
        op = module.op
        assert op.image is not None and op.grid is not None
        kernel = cpu.grid_sample(
            program_quantize(image, op.image), program_quantize(grid, op.grid), op
        )
        expected = kernel if op.output is None else program_dequantize(kernel, op.output)
        assert torch.equal(out, expected), (module.site_name, (out - expected).abs().max())
    return len(calls)


def test_eval_forward_at_every_sampler_is_the_cpp_kernel() -> None:
    prepared = prepared_model()
    keys = set(prepared.state_dict())
    replaced = qat.use_exact_samplers(prepared)
    sites = prepared_grid_samplers(prepared)
    assert replaced == [s.name for s in sites] and len(sites) == 2
    assert [(s.mode, s.padding_mode, s.align_corners) for s in sites] == [
        ("bilinear", "border", False), ("nearest", "zeros", True)
    ]  # fmt: skip
    modules = [prepared.get_submodule(str(s.replacement)) for s in sites]
    assert all(isinstance(m, qat.PreparedGridSample) for m in modules)
    snorm8_q, snorm16_q = (
        QParams(1 / 127, 0, -127, 127, torch.int8),
        QParams(1 / 32767, 0, -32767, 32767, torch.int16),
    )
    assert [m.op for m in modules] == [  # type: ignore[union-attr]
        GridSampleOp("bilinear", "border", False, snorm8_q, snorm16_q, snorm8_q),
        GridSampleOp("nearest", "zeros", True, snorm8_q, snorm16_q, snorm8_q),
    ]
    # No state of their own: the checkpoint of a prepared module is the same with or without.
    assert set(prepared.state_dict()) == keys
    assert qat.use_exact_samplers(prepared) == []  # already replaced: left as it is
    assert check_samplers_are_the_kernel(prepared, frames(2, 3)) == 6

    # A copy follows its own fake quantizes; convert_qat gives the aten samplers back.
    twin = copy.deepcopy(prepared)
    assert check_samplers_are_the_kernel(twin, frames(3, 1)) == 2
    converted = convert_qat(prepared)
    assert not any(isinstance(m, qat.PreparedGridSample) for m in converted.modules())


def test_an_observed_image_range_is_followed_while_training() -> None:
    """A calibrated (observed) image qspec moves while training: the sampler reads the
    parameters its fake quantize applies at each forward, and after training the eval forward
    is still the kernel's bits."""
    prepared = prepared_model(grid_sampler_image_qspec=observed_int8())
    qat.use_exact_samplers(prepared)
    module = next(m for m in prepared.modules() if isinstance(m, qat.PreparedGridSample))
    before = module.op
    prepared.train()
    optimizer = torch.optim.Adam(prepared.parameters(), lr=1e-2)
    for frame0, frame1 in frames(4, 3):
        loss = (prepared(frame0 * 1.5, frame1) - frame1).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert check_samplers_are_the_kernel(prepared, frames(5, 2)) == 4
    assert module.op.image != before.image  # the wider frames moved the observed range


class Bicubic(TwoSamplers):
    def __init__(self) -> None:
        super().__init__(mode="bicubic")


def fixed_fake_quant(
    scale: float, zero_point: int, low: int, high: int, dtype: torch.dtype
) -> object:
    return FixedQParamsFakeQuantize(
        observer=FixedQParamsObserver.with_args(
            scale=scale, zero_point=zero_point, dtype=dtype, quant_min=low, quant_max=high
        )
    )


def test_what_the_exact_sampler_cannot_mirror_is_refused_in_one_line() -> None:
    """A bicubic sampler in a prepared module: refused naming it, nothing replaced. The other
    refusals on that module's first sampler given other fake quantizes."""
    prepared = prepared_model(Bicubic())
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    code = prepared.code
    with pytest.raises(UnsupportedOpError) as caught:
        qat.use_exact_samplers(prepared)
    assert re.fullmatch(
        r"grid sampler grid_sampler(_2d)?_1: the exact integer sampler cannot mirror "
        r"mode='bicubic' \(it mirrors 'bilinear' and 'nearest'; the integer kernel has no "
        r"bicubic\): train it with PyTorch's sampler, or use another mode",
        str(caught.value),
    ), caught.value
    assert prepared.code == code  # the bilinear sampler before it was not replaced either
    assert all(s.replacement is None for s in prepared_grid_samplers(prepared))
    assert all(torch.equal(v, state[k]) for k, v in prepared.state_dict().items())

    site = prepared_grid_samplers(prepared)[0]
    cases: list[tuple[dict[str, object], str]] = [
        (
            {"image": None},
            r"grid sampler \w+: its image is not quantized \(float\); the exact integer sampler "
            r"needs a quantized image \(int8 image, int16 or int8 grid\): give the sampler an "
            r"image qspec \(the exporter's default does\)",
        ),
        (
            {"output": fixed_fake_quant(1e-4, 0, -128, 127, torch.qint8)},
            r"grid sampler \w+: op: the exact integer sampler cannot mirror .*image scale / "
            r"output scale exceeds 32",
        ),
        (
            {"image": fixed_fake_quant(1 / 255, 0, 0, 255, torch.quint8)},
            r"grid sampler \w+: op: the exact integer sampler cannot mirror .*needs an int8 "
            r"image \(op.image.dtype\), got torch.uint8",
        ),
        (
            {"grid": fixed_fake_quant(200.0, 0, -32768, 32767, torch.int16)},
            r"grid sampler \w+: the exact integer sampler cannot mirror mode='bilinear', "
            r"padding_mode='border', align_corners=False on its 12 x 20 image: .*",
        ),
        (
            {"grid": site.grid, "image": site.grid, "output": site.output},
            r"grid sampler \w+: op: the exact integer sampler cannot mirror .*needs an int8 "
            r"image \(op.image.dtype\), got torch.int16",
        ),
    ]
    for change, message in cases:
        with pytest.raises(UnsupportedOpError) as caught:
            qat.exact_sampler(dataclasses.replace(site, **change))  # type: ignore[arg-type]
        assert re.fullmatch(message, str(caught.value)), caught.value
    with pytest.raises(TypeError, match=r"^site must be an etkit_quant\.QatGridSampler"):
        qat.exact_sampler("grid_sampler")  # type: ignore[arg-type]
