"""The qspec presets: values, validation, read-back, and fixed parameters through PT2E."""

from __future__ import annotations

import pytest
import torch
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant import FixedQParams, fixed, fixed_qparams, qformat, snorm8, snorm16, unorm8


@pytest.mark.parametrize(
    ("qspec", "expected"),
    [
        (snorm8(), FixedQParams(1 / 127, 0, -127, 127, torch.int8)),
        (snorm16(), FixedQParams(1 / 32767, 0, -32767, 32767, torch.int16)),
        (unorm8(), FixedQParams(1 / 255, 0, 0, 255, torch.uint8)),
        (qformat(7), FixedQParams(2**-7, 0, -127, 127, torch.int8)),
        (qformat(12, bits=16), FixedQParams(2**-12, 0, -32767, 32767, torch.int16)),
        (qformat(4, signed=False), FixedQParams(2**-4, 0, 0, 255, torch.uint8)),
        (fixed(0.5, 3, torch.int8, -10, 100), FixedQParams(0.5, 3, -10, 100, torch.int8)),
    ],
)
def test_presets_read_back(qspec: QuantizationSpec, expected: FixedQParams) -> None:
    assert isinstance(qspec, QuantizationSpec) and not qspec.is_dynamic
    assert fixed_qparams(qspec) == expected
    assert (qspec.dtype, qspec.quant_min, qspec.quant_max) == (
        expected.dtype,
        expected.quant_min,
        expected.quant_max,
    )


def test_equal_and_hashable_by_value() -> None:
    assert snorm8() == snorm8() and hash(snorm8()) == hash(snorm8())
    assert snorm8() != snorm16() and snorm8() != qformat(7)
    assert qformat(7) == fixed(2**-7, 0, torch.int8, -127, 127)
    assert len({snorm8(), snorm8(), unorm8()}) == 2


def test_observer_reports_the_fixed_parameters_whatever_it_sees() -> None:
    qspec = fixed(0.25, -3, torch.int8, -100, 100)
    observer = qspec.observer_or_fake_quant_ctr.with_args(
        dtype=qspec.dtype, quant_min=qspec.quant_min, quant_max=qspec.quant_max,
        qscheme=qspec.qscheme, is_dynamic=False,
    )()  # fmt: skip
    observer(torch.randn(100) * 1000)
    scale, zero_point = observer.calculate_qparams()
    assert float(scale) == 0.25 and int(zero_point) == -3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 0, torch.int8, -127, 127), "scale must be positive and finite"),
        ((float("inf"), 0, torch.int8, -127, 127), "scale must be positive and finite"),
        ((float("nan"), 0, torch.int8, -127, 127), "scale must be positive and finite"),
        ((0.1, 0, torch.float32, -127, 127), "dtype must be one of"),
        ((0.1, 0, torch.int8, -129, 127), r"inside torch.int8's \[-128, 127\]"),
        ((0.1, 0, torch.uint8, 0, 256), "inside torch.uint8"),
        ((0.1, 0, torch.int8, 10, -10), "non-empty"),
        ((0.1, 50, torch.int8, -10, 10), "zero_point 50 must lie in"),
        ((0.1, 0.5, torch.int8, -10, 10), "zero_point must be an int"),
    ],
)
def test_fixed_validates(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fixed(*args)  # type: ignore[arg-type]


def test_qformat_validates() -> None:
    with pytest.raises(ValueError, match="frac_bits"):
        qformat(-1)
    with pytest.raises(ValueError, match="bits=8 or 16"):
        qformat(3, bits=12)
    with pytest.raises(ValueError, match="bits=8 when unsigned"):
        qformat(3, bits=16, signed=False)


def test_fixed_qparams_refuses_observed_qspecs() -> None:
    from torchao.quantization.pt2e.observer import MinMaxObserver

    observed = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver)
    with pytest.raises(ValueError, match="observed, not fixed"):
        fixed_qparams(observed)
    with pytest.raises(TypeError, match="QuantizationSpec"):
        fixed_qparams("snorm8")  # type: ignore[arg-type]
