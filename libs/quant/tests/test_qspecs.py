"""The qspec presets: values, validation, read-back, and fixed parameters through PT2E."""

from __future__ import annotations

import pytest
import torch
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_quant import (
    FixedQParams,
    covering,
    describe_qspec,
    fixed,
    fixed_qparams,
    fixed_scale,
    is_fixed,
    observed_int8,
    qformat,
    snorm8,
    snorm16,
    unorm8,
)


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


# -- fixed scales, covering, observed, descriptions ----------------------------------------------


@pytest.mark.parametrize(
    ("max_abs", "dtype", "scale"),
    [
        (1.5, torch.int16, 2 / 32767),
        (2.0, torch.int16, 2 / 32767),  # a power of two covers itself exactly
        (2.0000001, torch.int16, 4 / 32767),
        (1.0, torch.int16, 1 / 32767),
        (0.3, torch.int16, 0.5 / 32767),
        (20, torch.int8, 32 / 127),
        (3.9, torch.int8, 4 / 127),
        (1000.0, torch.int32, 1024 / (2**31 - 1)),
    ],
)
def test_covering_is_the_smallest_power_of_two_range(
    max_abs: float, dtype: torch.dtype, scale: float
) -> None:
    qspec = covering(max_abs, dtype)
    params = fixed_qparams(qspec)
    assert params.scale == scale and params.zero_point == 0
    assert params.quant_min == -params.quant_max and params.high >= max_abs
    assert params.high / 2 < max_abs  # the smallest such power of two
    assert qspec == fixed_scale(scale, dtype)


def test_covering_one_is_snorm16_and_fixed_scale_ranges() -> None:
    assert covering(1.0) == snorm16() and covering(1.0, torch.int8) == snorm8()
    assert fixed_scale(1 / 255, torch.uint8) == unorm8()
    assert fixed_qparams(fixed_scale(0.5, torch.int8)) == FixedQParams(
        0.5, 0, -127, 127, torch.int8
    )
    params = fixed_qparams(fixed(0.5, 3, torch.int8, -10, 100))
    assert (params.low, params.high) == (-6.5, 48.5)


@pytest.mark.parametrize("max_abs", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_covering_validates(max_abs: object) -> None:
    with pytest.raises(ValueError, match="max_abs must be positive and finite"):
        covering(max_abs)  # type: ignore[arg-type]


def test_covering_needs_a_signed_dtype() -> None:
    with pytest.raises(ValueError, match="signed dtype"):
        covering(2.0, torch.uint8)
    with pytest.raises(ValueError, match="dtype must be one of"):
        fixed_scale(0.1, torch.float16)


def test_observed_int8_is_static_and_equal_by_value() -> None:
    qspec = observed_int8()
    assert qspec == observed_int8() and hash(qspec) == hash(observed_int8())
    assert (qspec.dtype, qspec.quant_min, qspec.quant_max) == (torch.int8, -127, 127)
    assert qspec.qscheme == torch.per_tensor_affine and not qspec.is_dynamic
    assert not is_fixed(qspec) and is_fixed(snorm8()) and not is_fixed(None)


@pytest.mark.parametrize(
    ("qspec", "text"),
    [
        (snorm8(), "SNORM8 (int8, scale 1/127)"),
        (snorm16(), "SNORM16 (int16, scale 1/32767)"),
        (unorm8(), "UNORM8 (uint8, scale 1/255)"),
        (covering(1.5), "int16, fixed scale 2/32767, range [-2, 2]"),
        (covering(20, torch.int8), "int8, fixed scale 32/127, range [-32, 32]"),
        (qformat(7), "int8, fixed scale 2**-7, range [-0.992188, 0.992188]"),
        (
            fixed(0.5, 3, torch.int8, -10, 100),
            "int8, fixed scale 0.5, zero point 3, range [-6.5, 48.5]",
        ),
        (observed_int8(), "int8, observed (MinMaxObserver), [-127, 127]"),
        (None, "float"),
    ],
)
def test_describe_qspec(qspec: QuantizationSpec | None, text: str) -> None:
    assert describe_qspec(qspec) == text
