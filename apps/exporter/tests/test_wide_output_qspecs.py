"""A 16-bit (or 32-bit) output qspec XNNPACK cannot produce is refused before calibration, in one
line naming the output, the qspec and the op, and saying what to do; the wide outputs XNNPACK
does produce still export and verify, and VGF (int16 activations) takes the refused one.

Measured with ExecuTorch 1.5.1 (each case exported and loaded in ``executorch.runtime`` with
the refusal switched off): XNNPACK cannot produce a wide output whose parameters
``BoundaryQuantizer`` puts on an op it computes from int8 values, which happens when the output
comes from an op XNNPACK's quantizer leaves alone (clamp, tanh): the boundary's parameters move
back through it onto the conv, linear, add or mul before it, whose partition XNNPACK's runtime
then refuses ("Failed to create convolution node 6 with code: xnn_status_invalid_parameter").
It produces a wide output of an op it quantizes itself (conv, add, a conv's relu, hardtanh,
max pool, a permute: etkit requantizes the int8 result on the portable kernels), of a grid
sampler (bilinear, nearest, bicubic, and a clamp or tanh of one), and of the coordinate
arithmetic (an ``affine_grid`` returned as output)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter import ExportError, export_model
from etkit_exporter.core.targets import VGF_TOSA_SPEC
from etkit_exporter.export.arguments import (
    CALIBRATED,
    QuantOptions,
    UnproducibleQspecError,
)
from etkit_exporter.export.demos import DEMOS, pixel_grid
from etkit_exporter.export.lowering import target_backend
from etkit_exporter.export.quantization import refuse_unproducible_outputs
from etkit_quant import fixed, qformat, snorm8, snorm16
from etkit_quant.normalize import normalize_program

Q3_12 = qformat(12, bits=16)
INT32 = fixed(2**-20, 0, torch.int32, -(2**31) + 1, 2**31 - 1)


class _Conv(torch.nn.Module):
    def __init__(self, after: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(4, 4, 1)
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.conv(x))


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.linear(x), -1, 1)


class _Lambda(torch.nn.Module):
    def __init__(self, function: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.function(*args)


class _ConvThenSample(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(self.conv(x), grid, align_corners=False)


class _ReturnsAGrid(torch.nn.Module):
    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        return F.affine_grid(theta * 0.5, [1, 1, 8, 4], align_corners=False)


_X = torch.rand(1, 4, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
_Y = torch.rand(1, 4, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
_GRID = pixel_grid(12, 20) * 0.9


def _clamp(t: torch.Tensor) -> torch.Tensor:
    return torch.clamp(t, -1, 1)


def _sample(x: torch.Tensor, g: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    return F.grid_sample(x, g, mode=mode, align_corners=False)


# (model, inputs, the op that would write the wide output: None where XNNPACK produces it)
CASES: dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...], str | None]] = {
    "conv-clamp": (_Conv(_clamp), (_X,), "conv2d"),
    # a tanh computes new values: its input keeps the conv's int8 parameters, the tanh runs in
    # float and its output is quantized to int16 outside XNNPACK
    "conv-tanh": (_Conv(torch.tanh), (_X,), None),
    "linear-clamp": (_Linear(), (torch.rand(2, 16),), "linear"),
    "add-clamp": (_Lambda(lambda a, b: _clamp(a + b)), (_X, _Y), "add"),
    "mul-clamp": (_Lambda(lambda a: _clamp(a * 2.0)), (_X,), "mul"),
    "conv": (_Conv(), (_X,), None),
    "conv-relu": (_Conv(torch.relu), (_X,), None),
    "conv-hardtanh": (_Conv(F.hardtanh), (_X,), None),
    "conv-max-pool": (_Conv(lambda t: F.max_pool2d(t, 2)), (_X,), None),
    "conv-permute": (_Conv(lambda t: t.permute(0, 2, 3, 1)), (_X,), None),
    "add": (_Lambda(lambda a, b: a + b), (_X, _Y), None),
    "sampler": (_Lambda(_sample), (_X, _GRID), None),
    "bicubic-sampler": (_Lambda(lambda x, g: _sample(x, g, "bicubic")), (_X, _GRID), None),
    "sampler-clamp": (_Lambda(lambda x, g: _sample(x, g).clamp(-0.5, 0.5)), (_X, _GRID), None),
    "sampler-tanh": (_Lambda(lambda x, g: torch.tanh(_sample(x, g))), (_X, _GRID), None),
    "conv-sampler": (_ConvThenSample(), (_X, _GRID), None),
    "returned-grid": (_ReturnsAGrid(), (torch.rand(1, 2, 3) - 0.5,), None),
}  # fmt: skip


def _options(
    outputs: tuple[QuantizationSpec, ...], inputs: tuple[torch.Tensor, ...]
) -> QuantOptions:
    return QuantOptions(
        enabled=True, inputs=None, outputs=outputs, sampler_image=CALIBRATED,
        sampler_grid=CALIBRATED, sampler_output=CALIBRATED, samples=(inputs,), on_sample=None,
    )  # fmt: skip


WIDTHS = [(case, "q3.12", Q3_12) for case in CASES] + [
    (case, name, qspec)
    for case in ("conv-clamp", "conv")
    for name, qspec in (("snorm16", snorm16()), ("int32", INT32))
]


@pytest.mark.parametrize(
    ("case", "qspec"), [(c, q) for c, _, q in WIDTHS], ids=[f"{c}-{n}" for c, n, _ in WIDTHS]
)
def test_which_wide_outputs_xnnpack_refuses(
    case: str, qspec: QuantizationSpec, tmp_path: Path
) -> None:
    model, inputs, writer = CASES[case]
    exported, _ = normalize_program(torch.export.export(model.eval(), inputs, strict=True), inputs)
    base = target_backend("xnnpack", tmp_path, VGF_TOSA_SPEC)[0]
    options = _options((qspec,), inputs)
    if writer is None:
        refuse_unproducible_outputs(exported, base, options)
        return
    with pytest.raises(UnproducibleQspecError) as refused:
        refuse_unproducible_outputs(exported, base, options)
    message = str(refused.value)
    assert message.startswith("output 0 asks for ") and "\n" not in message, message
    assert f"{writer} (aten::" in message, message
    assert "give output 0 an 8-bit qspec for XNNPACK" in message and "vgf" in message, message
    assert refused.value.boundary == "output 0" and refused.value.op == writer
    vgf = target_backend("vgf", tmp_path, VGF_TOSA_SPEC)[0]
    refuse_unproducible_outputs(exported, vgf, options)  # VGF computes int16: nothing refused


def test_the_command_refuses_it_in_one_line_before_any_work(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), "demo", "resample", "--target",
         "xnnpack", "--quant-output", "q3.12", "--quant-output", "snorm8", "-o", "out"],
        capture_output=True, text=True, check=False, cwd=tmp_path, env=dict(os.environ),
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("etkit-export: usage error: output 0 asks for int16, fixed scale 2**-12")
    assert "conv2d (aten::conv2d)" in line and "snorm8" in line and "vgf" in line, line
    assert "stage quantize" not in done.stdout and "calibration" not in done.stdout, done.stdout
    assert not (tmp_path / "out").exists()


def test_the_api_refuses_it_with_the_refusal_as_cause(tmp_path: Path) -> None:
    model, inputs = DEMOS["resample"]()
    with pytest.raises(ExportError) as failed:
        export_model(
            model, inputs, artifacts_root=tmp_path / "out", target="xnnpack",
            quantized_output_qspecs=(Q3_12, snorm8()),
        )  # fmt: skip
    assert isinstance(failed.value.__cause__, UnproducibleQspecError)
    assert "output 0 asks for int16" in str(failed.value)
    assert not (tmp_path / "out").exists()


def _verified(result: object) -> None:
    verification = getattr(result, "verification", None)
    assert verification is not None and verification["verdict"]["result"] == "pass", verification


def test_wide_outputs_xnnpack_produces_still_export_and_verify(tmp_path: Path) -> None:
    model, inputs = DEMOS["resample"]()  # output 1: a nearest grid sampler's
    result = export_model(
        model, inputs, artifacts_root=tmp_path / "sampler", target="xnnpack", verify=True,
        quantized_output_qspecs=(snorm8(), Q3_12),
    )  # fmt: skip
    assert [o["dtype"] for o in result.io_quant_params["outputs"]] == ["int8", "int16"]
    _verified(result)
    result = export_model(
        _Conv().eval(), (_X,), artifacts_root=tmp_path / "conv", target="xnnpack", verify=True,
        quantized_output_qspecs=(Q3_12,),
    )  # fmt: skip
    assert result.io_quant_params["outputs"][0]["dtype"] == "int16"
    _verified(result)


@pytest.mark.slow
def test_vgf_takes_the_output_xnnpack_refuses(tmp_path: Path) -> None:
    model, inputs = DEMOS["resample"]()
    result = export_model(
        model, inputs, artifacts_root=tmp_path / "out", target="vgf", verify=True,
        quantized_output_qspecs=(Q3_12, snorm8()),
    )  # fmt: skip
    assert [o["dtype"] for o in result.io_quant_params["outputs"]] == ["int16", "int8"]
    _verified(result)
