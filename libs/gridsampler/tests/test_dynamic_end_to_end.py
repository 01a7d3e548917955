"""End to end with dynamic sizes: one program exported with ``torch.export`` dynamic dimensions
(bounded H and W of the image, Ho and Wo of the grid, in one test the batch too) and lowered to
etkit's grid-sampler delegate, whose blob (format version 3) holds the bounds, not a size. The
one program runs in executorch.runtime at sizes across the bounds (both ends, odd sizes, in an
order that goes down and up again), each output bit for bit what the CPU kernel computes at that
size; a size outside the bounds is refused (``InvalidArgument``) with the delegate's log line
naming the argument, its size and the bounds, nothing crashes, and the method still runs after;
the same program runs in etkit_pterunner (where it is installed: it is no dependency of this
package) with the same outputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime
from torch.export import Dim

from etkit_gridsampler import GridSampleOp, GridSamplerPartitioner, QParams, cpu, runtime
from etkit_gridsampler.call_sites import check_call_sites
from etkit_gridsampler.delegate_format import DelegateBlob, decode, shape_text

IMAGE_Q = QParams(1 / 127, 0, -127, 127, torch.int8)
GRID_Q = QParams(1 / 32767, 0, -32767, 32767, torch.int16)
OUTPUT_Q = QParams(1 / 100, 3, -128, 127, torch.int8)
CHANNELS = 3

# The bounds the program is exported with: H and W of the image, Ho and Wo of the grid (Wo with
# torch's default lower bound).
H, W = Dim("h", min=4, max=64), Dim("w", min=4, max=96)
HO, WO = Dim("ho", min=1, max=48), Dim("wo", max=80)
EXAMPLE = (16, 24, 12, 20)  # H, W, Ho, Wo of the example inputs
# Sizes the one program runs at: the example, both ends of the bounds, odd sizes, going down and
# up again (a plan or an output size left from the call before would show).
SIZES = [EXAMPLE, (64, 96, 48, 80), (4, 4, 1, 1), (33, 17, 21, 9), (7, 95, 47, 3), (64, 5, 1, 80)]

CONFIGS = {
    "bilinear-border": GridSampleOp("bilinear", "border", False, IMAGE_Q, GRID_Q, OUTPUT_Q),
    "nearest-reflection-corners": GridSampleOp("nearest", "reflection", True, IMAGE_Q, GRID_Q),
    "float-zeros": GridSampleOp("bilinear", "zeros", False),
}


class Sample(torch.nn.Module):
    """``op`` on an image and a grid from outside: integers in and out for a quantized op
    (dequantize -> grid sampler -> quantize, one delegate), float32 for a float op."""

    def __init__(self, op: GridSampleOp) -> None:
        super().__init__()
        self.op = op

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        op = self.op
        if op.image is not None and op.grid is not None:
            image = _dq(image, op.image)
            grid = _dq(grid, op.grid)
        out = F.grid_sample(
            image, grid, mode=op.mode, padding_mode=op.padding_mode, align_corners=op.align_corners
        )
        if op.output is None:
            return out
        p = op.output
        result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(
            out, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
        )
        return result


def _dq(q: torch.Tensor, p: QParams) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(
        q, p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype
    )
    return result


def _inputs(op: GridSampleOp, n: int, h: int, w: int, ho: int, wo: int) -> list[torch.Tensor]:
    """Random image and grid, the grid reaching a little past the image's edges."""
    generator = torch.Generator().manual_seed(n * 10**8 + h * 10**6 + w * 10**4 + ho * 100 + wo)
    if op.image is None:
        image = torch.randn(n, CHANNELS, h, w, generator=generator)
        grid = torch.rand(n, ho, wo, 2, generator=generator) * 2.4 - 1.2
        return [image, grid]
    image_q = torch.randint(-127, 128, (n, CHANNELS, h, w), generator=generator)
    grid_q = torch.randint(-34000, 34000, (n, ho, wo, 2), generator=generator).clamp(-32767, 32767)
    return [image_q.to(torch.int8), grid_q.to(torch.int16)]


def _lower(
    op: GridSampleOp, dynamic_shapes: tuple[dict[int, Dim], dict[int, Dim]], n: int = 1
) -> tuple[bytes, GridSamplerPartitioner, torch.export.ExportedProgram]:
    partitioner = GridSamplerPartitioner()
    exported = torch.export.export(
        Sample(op), tuple(_inputs(op, n, *EXAMPLE)), dynamic_shapes=dynamic_shapes, strict=True
    )
    manager = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    return manager.to_executorch().buffer, partitioner, manager.exported_program()


def _blob_of(pte: bytes) -> DelegateBlob:
    start = pte.find(b"ETGS")
    return decode(pte[start : start + 160])


@pytest.fixture(scope="module", params=list(CONFIGS))
def program(request: pytest.FixtureRequest) -> tuple[GridSampleOp, bytes]:
    op = CONFIGS[request.param]
    pte, partitioner, edge = _lower(op, ({2: H, 3: W}, {1: HO, 2: WO}))
    assert not partitioner.rejections
    (site,) = check_call_sites(edge)  # every size the call can pass is one the blob takes
    assert site.arguments[1][0] == (1, 48, 80, 2)
    return op, pte


def test_the_blob_holds_bounds_not_a_size(program: tuple[GridSampleOp, bytes]) -> None:
    op, pte = program
    blob = _blob_of(pte)
    assert blob.version == 3 and blob.op == op
    # Lower bounds: the Dim's min (4); torch's default min (0) reads as 2 in the traced program,
    # which the partitioner records as 1 (the program runs at 1, and so does the kernel).
    assert shape_text(blob.image_min_shape, blob.image_shape) == "[1, 3, 4..64, 4..96]"
    assert shape_text(blob.grid_min_shape, blob.grid_shape) == "[1, 1..48, 1..80, 2]"


def test_one_program_runs_every_size_bit_for_bit(program: tuple[GridSampleOp, bytes]) -> None:
    op, pte = program
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    for h, w, ho, wo in SIZES:
        image, grid = _inputs(op, 1, h, w, ho, wo)
        (output,) = method.execute([image, grid])
        expected = cpu.grid_sample(image, grid, op)
        assert output.shape == (1, CHANNELS, ho, wo) == expected.shape
        assert output.dtype == expected.dtype
        mismatches = int((output != expected).sum())
        assert mismatches == 0, f"{mismatches} values differ at {h}x{w} -> {ho}x{wo}"


@pytest.mark.parametrize(
    ("size", "line"),
    [
        ((65, 20, 12, 20), "the image (argument 0) has H 65, outside its bounds [4, 64]"),
        ((3, 24, 12, 20), "the image (argument 0) has H 3, outside its bounds [4, 64]"),
        ((16, 24, 12, 81), "the grid (argument 1) has Wo 81, outside its bounds [1, 80]"),
    ],
    ids=["above", "below", "grid"],
)
def test_a_size_outside_the_bounds_is_refused(
    program: tuple[GridSampleOp, bytes],
    capfd: pytest.CaptureFixture[str],
    size: tuple[int, int, int, int],
    line: str,
) -> None:
    """Sizes whose tensors still fit the memory planned for the upper bounds reach the delegate,
    which refuses them and says why; the method runs again after."""
    op, pte = program
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        method.execute(_inputs(op, 1, *size))
    err = capfd.readouterr().err
    dtype = "int8" if op.image is not None else "float32"
    assert f"image (argument 0): expected {dtype} [1, 3, 4..64, 4..96], got {dtype}" in err
    assert f"grid-sampler delegate: {line}" in err
    image, grid = _inputs(op, 1, *EXAMPLE)
    (output,) = method.execute([image, grid])
    assert torch.equal(output, cpu.grid_sample(image, grid, op))


def test_a_size_past_the_planned_memory_is_refused_by_executorch(
    program: tuple[GridSampleOp, bytes],
) -> None:
    """An input larger than its planned bound never reaches the delegate: ExecuTorch refuses to
    take it (no crash), and the method runs again after."""
    op, pte = program
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    with pytest.raises(RuntimeError):
        method.execute(_inputs(op, 1, 200, 200, 12, 20))
    image, grid = _inputs(op, 1, 33, 17, 21, 9)
    (output,) = method.execute([image, grid])
    assert torch.equal(output, cpu.grid_sample(image, grid, op))


class GridSamplerOnCpu:
    """The grid-sampler delegate in etkit_pterunner (a ``Backend``: ``DelegateInfo`` and
    ``DelegateCall`` in, typed ``Any`` here since etkit_pterunner is not a dependency of this
    package): the blob's op on ``cpu.grid_sample`` at the sizes of the call, the output resized
    to what it computed."""

    label = "etkit_gridsampler.cpu"

    def num_inputs(self, delegate: Any) -> int:
        return decode(delegate.processed).roles.inputs

    def execute(self, call: Any) -> str:
        blob = decode(call.delegate.processed)
        image, grid = call.inputs[blob.roles.image], call.inputs[blob.roles.grid]
        for role, tensor, bounds in (
            ("image", image, blob.image_bounds()),
            ("grid", grid, blob.grid_bounds()),
        ):
            if tensor.dim() != 4 or not all(
                lo <= s <= hi for s, (lo, hi) in zip(tensor.shape, bounds, strict=True)
            ):
                lower, upper = zip(*bounds, strict=True)
                dtype = str(tensor.dtype).removeprefix("torch.")
                raise call.fail(
                    f"the {role} is {dtype} {list(tensor.shape)}, outside "
                    f"{shape_text(lower, upper)}"
                )
        result = cpu.grid_sample(image, grid, blob.op)
        call.resize_output(0, result.shape).copy_(result)
        return self.label


def test_the_same_program_runs_in_pterunner(program: tuple[GridSampleOp, bytes]) -> None:
    """etkit_pterunner, where it is installed (the development environment: always; this
    package alone, from its wheel, does not depend on it)."""
    pterunner = pytest.importorskip("etkit_pterunner")
    op, pte = program
    runner = pterunner.PteProgram.from_bytes(
        pte, backends={"GridSamplerBackend": GridSamplerOnCpu()}
    )
    assert runner.unsupported() == []
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    for h, w, ho, wo in SIZES:
        inputs = _inputs(op, 1, h, w, ho, wo)
        result = runner.run(inputs, keep_delegate_io=True)
        (expected,) = method.execute(inputs)
        (actual,) = result.outputs
        assert actual.shape == (1, CHANNELS, ho, wo) and torch.equal(actual, expected)
        (call,) = result.delegate_calls
        assert call.outputs is not None and call.outputs[0].shape == (1, CHANNELS, ho, wo)
    # Below the lower bound (the runner itself refuses inputs past the planned bound).
    with pytest.raises(
        pterunner.ExecutionError, match=r"the image is \w+ \[1, 3, 3, 24\], outside \[1, 3, 4"
    ):
        runner.run(_inputs(op, 1, 3, 24, 12, 20))


def test_a_dynamic_batch(capfd: pytest.CaptureFixture[str]) -> None:
    """N dynamic too (one dimension of image and grid): N from 1 to 3 runs; an image and a grid
    of different N are refused by the delegate, naming both."""
    op = CONFIGS["bilinear-border"]
    n = Dim("n", min=1, max=3)
    pte, partitioner, _ = _lower(op, ({0: n, 2: H, 3: W}, {0: n, 1: HO, 2: WO}), n=2)
    assert not partitioner.rejections
    blob = _blob_of(pte)
    assert shape_text(blob.image_min_shape, blob.image_shape) == "[1..3, 3, 4..64, 4..96]"
    assert shape_text(blob.grid_min_shape, blob.grid_shape) == "[1..3, 1..48, 1..80, 2]"
    runtime.register()
    method = Runtime.get().load_program(pte).load_method("forward")
    for batch, (h, w, ho, wo) in zip((3, 1, 2), SIZES[1:4], strict=True):
        image, grid = _inputs(op, batch, h, w, ho, wo)
        (output,) = method.execute([image, grid])
        assert output.shape == (batch, CHANNELS, ho, wo)
        assert torch.equal(output, cpu.grid_sample(image, grid, op))
    image, _ = _inputs(op, 2, *EXAMPLE)
    _, grid = _inputs(op, 3, *EXAMPLE)
    capfd.readouterr()
    with pytest.raises(RuntimeError):
        method.execute([image, grid])
    assert "the image's N 2 differs from the grid's N 3" in capfd.readouterr().err


def test_an_unbounded_dimension_is_left_undelegated() -> None:
    """A Dim without a max gives the program no memory bound for the delegate: the partitioner
    leaves the grid sampler undelegated and says why."""
    op = CONFIGS["bilinear-border"]
    exported = torch.export.export(
        Sample(op),
        tuple(_inputs(op, 1, *EXAMPLE)),
        dynamic_shapes=({2: Dim("h", min=4), 3: W}, {1: HO, 2: WO}),
        strict=True,
    )
    partitioner = GridSamplerPartitioner()
    to_edge(exported).to_backend(partitioner)
    (rejection,) = partitioner.rejections
    assert "the image's dimension 2 is dynamic" in rejection.reason
    assert "with no upper bound: give its torch.export Dim a max" in rejection.reason


def test_fixed_programs_keep_version_2() -> None:
    """Without dynamic dimensions the blob is version 2, as before."""
    op = CONFIGS["bilinear-border"]
    pte, _, _ = _lower(op, ({}, {}))
    start = pte.find(b"ETGS")
    blob = decode(pte[start : start + 124])
    assert blob.version == 2 and not blob.is_dynamic
    assert blob.image_shape == (1, CHANNELS, 16, 24) and blob.grid_shape == (1, 12, 20, 2)


def test_the_vgf_path_leaves_dynamic_samplers_to_the_delegate() -> None:
    """A VGF is compiled for one size: a sampler with dynamic sizes is no compute segment."""
    from etkit_gridsampler.vgf_shader.lowering import vgf_reason
    from etkit_quant.graph import is_grid_sampler

    op = CONFIGS["bilinear-border"]
    exported = torch.export.export(
        Sample(op),
        tuple(_inputs(op, 1, *EXAMPLE)),
        dynamic_shapes=({2: H, 3: W}, {1: HO, 2: WO}),
        strict=True,
    )
    graph = to_edge(exported).exported_program().graph
    (sampler,) = [node for node in graph.nodes if is_grid_sampler(node)]
    reason = vgf_reason(sampler)
    assert reason is not None and reason.startswith("its sizes are dynamic (torch.export Dims)")
