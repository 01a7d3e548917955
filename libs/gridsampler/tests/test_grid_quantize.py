"""A grid quantized on entry to the delegate (the quantize before a sampler, fused): the C++
quantize against ExecuTorch's own portable quantize_per_tensor kernel and against
``op.quantize_per_tensor``, and the fused sampler against the sampler of the quantized grid."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime

from etkit_gridsampler import cpu
from etkit_gridsampler.op import GridSampleOp, QParams, quantize_per_tensor

SNORM8 = QParams(1 / 127, 0, -128, 127, torch.int8)
GRID_QPARAMS = [
    QParams(1 / 32767, 0, -32768, 32767, torch.int16),  # snorm16
    QParams(6.1037e-05, -3, -32000, 32767, torch.int16),
    QParams(1 / 64, 5, -100, 120, torch.int8),
]


def _values(qparams: QParams) -> torch.Tensor:
    """Ordinary values, rounding ties (half steps), values past the range, signed zeros and
    values past int32 (not past int64: there ExecuTorch's conversion is undefined, see
    test_values_beyond_int64_saturate); a count that leaves a tail for the vector loop."""
    torch.manual_seed(0)
    inverse = torch.tensor(1.0) / torch.tensor(qparams.scale, dtype=torch.float32)
    ties = (torch.arange(-3000, 3000, dtype=torch.float32) + 0.5) / inverse
    special = torch.tensor([0.0, -0.0, 3e9, -3e9, 1e13, -1e13, 4.0, -4.0])
    return torch.cat([torch.randn(20011) * 2, ties, special])


class _Quantize(torch.nn.Module):
    def __init__(self, qparams: QParams) -> None:
        super().__init__()
        self.q = qparams

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q
        return torch.ops.quantized_decomposed.quantize_per_tensor(
            x, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
        )


@pytest.mark.parametrize("qparams", GRID_QPARAMS, ids=["snorm16", "int16-zp", "int8"])
def test_the_kernel_quantizes_as_executorchs_portable_kernel(
    qparams: QParams, tmp_path: Path
) -> None:
    values = _values(qparams)
    program = to_edge(torch.export.export(_Quantize(qparams), (values,), strict=True))
    path = tmp_path / "quantize.pte"
    path.write_bytes(program.to_executorch().buffer)
    (portable,) = Runtime.get().load_program(path).load_method("forward").execute([values])
    assert portable.dtype == qparams.dtype
    for isa in cpu.available_isas():
        ours = cpu.quantize_grid(values, qparams, isa=isa)
        assert torch.equal(ours, portable), (isa, (ours != portable).nonzero()[:5])
    assert torch.equal(quantize_per_tensor(values, qparams), portable)


def test_values_beyond_int64_saturate() -> None:
    """Where ExecuTorch's conversion to int64 is undefined (x86 gives its minimum, so 1e30
    became quant_min there): NaN gives quant_min, infinities and values beyond int64 their side's
    bound, in every instruction set and in PyTorch alike."""
    qparams = GRID_QPARAMS[1]
    values = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30] * 7)
    expected = torch.tensor([-32000, 32767, -32000, 32767, -32000] * 7, dtype=torch.int16)
    for isa in cpu.available_isas():
        assert torch.equal(cpu.quantize_grid(values, qparams, isa=isa), expected), isa
    assert torch.equal(quantize_per_tensor(values, qparams), expected)


@pytest.mark.parametrize("grid_q", [GRID_QPARAMS[0], GRID_QPARAMS[2]], ids=["int16", "int8"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_the_fused_sampler_gives_the_quantized_grids_output(grid_q: QParams, mode: str) -> None:
    """Batch 2 and 3, 1 to 16 channels, planar and channels-last images, contiguous and strided
    grids, int8 and float outputs, one thread and two: the chunks the delegate quantizes and
    samples give the output of the whole quantized grid."""
    torch.manual_seed(1)
    shapes = [(2, 3, 37, 61, 300, 301), (1, 4, 17, 9, 5, 7), (3, 16, 20, 30, 257, 130)]
    for output_q in (SNORM8, None):
        op = GridSampleOp(mode, "border", True, SNORM8, grid_q, output_q)  # type: ignore[arg-type]
        for n, c, h, w, ho, wo in shapes:
            image = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8)
            if c == 4:
                image = image.contiguous(memory_format=torch.channels_last)
            grid = torch.rand(n, ho, wo, 2) * 2.4 - 1.2
            strided = grid.transpose(1, 2).contiguous().transpose(1, 2)
            for g in (grid, strided):
                expected = cpu.grid_sample(image, quantize_per_tensor(g, grid_q), op)
                for threads in (1, 2):
                    got = cpu.grid_sample_float_grid(image, g, op, num_threads=threads)
                    assert torch.equal(got, expected), (n, c, h, w, threads, output_q)


def test_the_fused_sampler_refuses_what_it_cannot_take() -> None:
    image = torch.zeros(1, 1, 4, 4, dtype=torch.int8)
    grid = torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match="needs a quantized op"):
        cpu.grid_sample_float_grid(image.float(), grid, GridSampleOp())
    op = GridSampleOp(image=SNORM8, grid=GRID_QPARAMS[0], output=SNORM8)
    with pytest.raises(ValueError, match=r"grid must be torch.float32 .* got torch.int16"):
        cpu.grid_sample_float_grid(image, grid.to(torch.int16), op)
    with pytest.raises(ValueError, match="same batch size"):
        cpu.grid_sample_float_grid(image, torch.zeros(2, 2, 2, 2), op)
