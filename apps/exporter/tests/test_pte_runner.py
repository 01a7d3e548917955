"""The app's programs (etkit_pterunner with the app's delegates, ``load_program``) on real
programs: grid-sampler delegates give outputs identical to executorch.runtime on the CPU and the
Vulkan kernel; VGF exports of the demos run whole on lavapipe and match the converted PT2E
model; a Python delegate replacing the grid sampler keeps the blob's input count. The runner's
own behaviour (kernels, control flow, bad files and inputs) is tested in libs/pterunner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter import ExportResult, export_model
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.programs import load_program, program_from_bytes
from etkit_gridsampler import GridSamplerPartitioner, cpu, runtime
from etkit_gridsampler.delegate_format import decode
from etkit_pterunner import ExecutionError, UnsupportedProgramError
from etkit_quant import BoundaryQuantizer, quantize, snorm8


def _pixel_grid(height: int, width: int) -> torch.Tensor:
    ys, xs = torch.linspace(-1, 1, height), torch.linspace(-1, 1, width)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((grid_x, grid_y), -1).unsqueeze(0)


class TwoSamplers(torch.nn.Module):
    """Two grid samplers on one grid (bilinear/zeros and nearest/border), the grid computed
    from a flow input (permute, clamp), then cat, add, a reshape (an elided view) and a slice."""

    def forward(self, image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        grid = flow.permute(0, 2, 3, 1).clamp(-1, 1)
        smooth = F.grid_sample(image, grid, align_corners=False)
        sharp = F.grid_sample(
            torch.relu(image), grid, mode="nearest", padding_mode="border", align_corners=True
        )
        mixed = torch.cat([smooth, sharp], 1) + smooth.repeat(1, 2, 1, 1)
        return torch.relu(mixed.reshape(1, -1, 6 * 5)[:, 1:, :])


INT8 = (1 / 127, 0, -127, 127, torch.int8)
INT16 = (1 / 32767, 0, -32767, 32767, torch.int16)


def _q(x: torch.Tensor, qparams: tuple[Any, ...]) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(x, *qparams)
    return result


def _dq(x: torch.Tensor, qparams: tuple[Any, ...]) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(x, *qparams)
    return result


class ChannelsLast(torch.nn.Module):
    """Channels-last float images quantized and dequantized by kernels of the program, the
    first sampled by reflection through the int8 grid sampler, its output made channels-last
    and added to the second (dim orders (0, 2, 3, 1) through the program)."""

    def forward(self, image: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        grid = _dq(_q(_pixel_grid(8, 8) * 0.8, INT16), INT16)
        source = _dq(_q(image, INT8), INT8)
        warped = F.grid_sample(source, grid, padding_mode="reflection", align_corners=False)
        warped = _dq(_q(warped, INT8), INT8).contiguous(memory_format=torch.channels_last)
        return _q(torch.clamp(warped + _dq(_q(other, INT8), INT8), -1, 1), INT8)


class GridFirst(torch.nn.Module):
    """``forward(grid, image)`` on integer tensors: the grid is the first input, so the delegate
    receives it first."""

    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        positions = _dq(grid, INT16)
        sampled = F.grid_sample(_dq(image, INT8), positions, align_corners=False)
        return _q(torch.relu(_dq(_q(sampled, INT8), INT8)), INT8)


def _rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) * 2 - 1


def _cl(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


Case = tuple[torch.nn.Module, tuple[torch.Tensor, ...], tuple[QuantizationSpec, ...] | None]


def _cases() -> dict[str, Case]:
    torch.manual_seed(0)
    two = (_rand(1, 4, 8, 8), _rand(1, 2, 6, 5))
    last = (_cl(_rand(1, 4, 8, 8)), _cl(_rand(1, 4, 8, 8)))
    grid = _pixel_grid(5, 7) * 0.9 + 0.05 * _rand(1, 5, 7, 2)
    first = (_q(grid, INT16), _q(_rand(1, 4, 8, 8), INT8))
    return {
        "two-samplers-float": (TwoSamplers(), two, None),
        "two-samplers-pt2e-int8": (TwoSamplers(), two, (snorm8(), snorm8())),
        "channels-last-int8": (ChannelsLast(), last, None),
        "grid-first-int8": (GridFirst(), first, None),
    }


CASES = _cases()
QUANTIZED = {"two-samplers-pt2e-int8", "channels-last-int8", "grid-first-int8"}


def _lower(case: Case, path: Path) -> Path:
    """The case (PT2E-quantized when it has qspecs) lowered with only the grid-sampler
    partitioner: everything else stays in ExecuTorch's portable and quantized kernels."""
    model, inputs, qspecs = case
    module: torch.nn.Module = model.eval()
    if qspecs is not None:
        quantizer = BoundaryQuantizer(
            XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
            input_qspecs=qspecs,
            output_qspecs=(snorm8(),),
        )
        module = quantize(module, inputs, quantizer)
    partitioner = GridSamplerPartitioner()
    program = to_edge_transform_and_lower(
        torch.export.export(module, inputs, strict=False), partitioner=[partitioner]
    )
    assert not partitioner.rejections
    path.write_bytes(program.to_executorch().buffer)
    return path


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("portable")
    return {name: _lower(case, folder / f"{name}.pte") for name, case in CASES.items()}


def _executorch(path: Path, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    runtime.register()
    outputs = Runtime.get().load_program(path).load_method("forward").execute(list(inputs))
    return [y for y in outputs if isinstance(y, torch.Tensor)]


@pytest.mark.parametrize("name", list(CASES))
def test_identical_to_executorch_runtime(portable: dict[str, Path], name: str) -> None:
    inputs = CASES[name][1]
    expected = _executorch(portable[name], inputs)
    program = load_program(portable[name])
    assert program.method_names == ("forward",)
    assert program.unsupported() == []
    result = program.run(inputs)
    assert len(result.outputs) == len(expected)
    for actual, reference in zip(result.outputs, expected, strict=True):
        assert actual.dtype == reference.dtype
        assert torch.equal(actual, reference)
    assert result.warnings == []
    samplers = [d for d in program.delegates if d.backend_id == "GridSamplerBackend"]
    assert [c.backend_id for c in result.delegate_calls] == ["GridSamplerBackend"] * len(samplers)
    assert all(c.seconds > 0 for c in result.delegate_calls)
    # The Vulkan grid sampler (integer ops; float ops run on the CPU kernel) gives the same bits.
    on_vulkan = load_program(portable[name], grid_sampler_impl="vulkan").run(inputs)
    for actual, reference in zip(on_vulkan.outputs, expected, strict=True):
        assert torch.equal(actual, reference)
    quantized = name in QUANTIZED
    assert {c.implementation.split()[0] for c in on_vulkan.delegate_calls} == {
        "etkit_gridsampler.vulkan" if quantized else "etkit_gridsampler.cpu"
    }


def test_program_description(portable: dict[str, Path]) -> None:
    program = load_program(portable["channels-last-int8"])
    method = program.method("forward")
    image, other = method.input_infos
    assert image.describe() == "float32 [1, 4, 8, 8] dim order (0, 2, 3, 1)"
    assert other.describe() == image.describe()
    assert "quantized_decomposed::quantize_per_tensor.out" in method.operators
    (delegate,) = program.delegates
    assert (delegate.backend_id, delegate.index, delegate.size) == ("GridSamplerBackend", 0, 124)
    assert len(delegate.instructions) == 1
    with pytest.raises(ValueError, match="has no method 'backward'; its methods: forward"):
        program.method("backward")


def test_keep_values_records_every_intermediate(portable: dict[str, Path]) -> None:
    inputs = CASES["two-samplers-pt2e-int8"][1]
    program = load_program(portable["two-samplers-pt2e-int8"])
    result = program.run(inputs, keep_values=True)
    assert result.values is not None
    method = program.method()
    for index in method.inputs:
        assert result.values[index].source == "input"
    (chain,) = method.chains
    delegates = [i for i in chain if i.kind == "delegate"]
    for instruction in delegates:
        roles = decode(method.delegates[instruction.delegate].processed).roles
        image_index = instruction.args[roles.image]
        output = result.values[instruction.args[-1]]
        assert output.source == "instruction" and output.instruction == instruction.position
        assert output.value.dtype == torch.int8
        assert result.values[image_index].value.dtype == torch.int8
    # The reshape is an elided view: no instruction writes it, it aliases its input's memory.
    aliases = [r for r in result.values.values() if r.source == "alias"]
    assert aliases and all(r.instruction is not None for r in aliases)
    (output_index,) = method.outputs
    assert torch.equal(result.values[output_index].value, result.outputs[0])


def test_python_delegate_replaces_the_grid_sampler(portable: dict[str, Path]) -> None:
    inputs = CASES["grid-first-int8"][1]
    path = portable["grid-first-int8"]
    expected = load_program(path).run(inputs).outputs
    calls: list[dict[str, Any]] = []

    def sampler(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        blob = decode(processed)
        image, grid = args[blob.roles.image], args[blob.roles.grid]
        calls.append({"roles": blob.roles, "image": image, "grid": grid, "specs": compile_specs})
        return [cpu.grid_sample(image, grid, blob.op)]

    program = load_program(path, delegates={"GridSamplerBackend": sampler})
    result = program.run(inputs)
    (call,) = calls
    # The grid is the first model input, and the delegate's first argument.
    assert (call["roles"].inputs, call["roles"].image, call["roles"].grid) == (2, 1, 0)
    assert call["grid"].dtype == torch.int16 and call["grid"].shape == (1, 5, 7, 2)
    assert call["image"].dtype == torch.int8 and call["image"].shape == (1, 4, 8, 8)
    assert call["specs"] == []
    assert torch.equal(result.outputs[0], expected[0])
    assert result.delegate_calls[0].implementation == f"Python function {sampler.__qualname__}"

    def wrong(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        return [torch.zeros(1, 4, 5, 7)]

    program.register_delegate("GridSamplerBackend", wrong)
    message = (
        r"instruction \d+: delegate 0 \(GridSamplerBackend\): the Python function "
        r".*wrong returned float32 \[1, 4, 5, 7\] as output 0, the program's value \d+ is "
        r"int8 \[1, 4, 5, 7\]"
    )
    with pytest.raises(ExecutionError, match=message):
        program.run(inputs)


def test_any_backend_through_a_python_delegate(portable: dict[str, Path], tmp_path: Path) -> None:
    """A backend id the runner does not know: refused before running, then run through a
    registered Python function, its inputs told from its outputs by which values earlier
    instructions write."""
    image, flow = CASES["two-samplers-float"][1]
    data = portable["two-samplers-float"].read_bytes()
    path = tmp_path / "other-backend.pte"
    path.write_bytes(data.replace(b"GridSamplerBackend", b"OtherSampleBackend"))
    program = load_program(path)
    with pytest.raises(UnsupportedProgramError) as caught:
        program.run([image, flow])
    message = str(caught.value)
    assert "method 'forward' cannot run in the .pte runner (2 problems)" in message
    assert "delegate 0 (backend 'OtherSampleBackend'): no implementation is registered" in message
    assert "delegate 1 (backend 'OtherSampleBackend')" in message
    seen: list[list[torch.Tensor]] = []

    def sample(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        seen.append(args)
        blob = decode(processed)
        return [cpu.grid_sample(args[blob.roles.image], args[blob.roles.grid], blob.op)]

    program.register_delegate("OtherSampleBackend", sample)
    result = program.run([image, flow])
    assert [[tuple(a.shape) for a in args] for args in seen] == [[(1, 4, 8, 8), (1, 6, 5, 2)]] * 2
    expected = load_program(portable["two-samplers-float"]).run([image, flow]).outputs
    assert torch.equal(result.outputs[0], expected[0])


# The VGF exports of the demos, run whole: VGF delegates on lavapipe, grid samplers on the CPU
# and on Vulkan.


def _quantize_input(x: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    if entry["scale"] is None:
        value = x
    else:
        dtype = {"int8": torch.int8, "int16": torch.int16}[entry["dtype"]]
        q = torch.round(x / entry["scale"]) + entry["zero_point"]
        value = q.clamp(entry["quant_min"], entry["quant_max"]).to(dtype)
    return _cl(value) if entry["dim_order"] == [0, 2, 3, 1] else value.contiguous()


def test_unknown_grid_sampler_implementation_named(portable: dict[str, Path]) -> None:
    """A grid-sampler implementation other than "cpu" or "vulkan", from a file or from bytes:
    a ValueError naming the parameter, its choices and the value given."""
    path = portable["two-samplers-float"]
    impl: Any = "gpu"
    message = r"grid_sampler_impl must be 'cpu' or 'vulkan', got 'gpu'"
    with pytest.raises(ValueError, match=message):
        load_program(path, grid_sampler_impl=impl)
    with pytest.raises(ValueError, match=message):
        program_from_bytes(path.read_bytes(), grid_sampler_impl=impl)


def _steps(y: torch.Tensor, reference: torch.Tensor, entry: dict[str, Any]) -> float:
    """Largest difference in output quantization steps."""
    value = (y.float() - entry["zero_point"]) * entry["scale"]
    return float(((value - reference).abs() / entry["scale"]).max())


_EXPORTS: dict[str, ExportResult] = {}


@pytest.fixture(scope="module")
def vgf_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    def get(name: str) -> ExportResult:
        if name not in _EXPORTS:
            model, inputs = DEMOS[name]()
            root = tmp_path_factory.mktemp("vgf") / name
            # the split program: VGF delegates around etkit's grid-sampler delegate
            _EXPORTS[name] = export_model(
                model, inputs, artifacts_root=root, target="vgf", sampler_delegate=True
            )
        return _EXPORTS[name]

    return get


_RUNS: dict[str, Any] = {}  # test_vgf_export_runs_whole's runs (default arguments)


@pytest.mark.parametrize(
    "name",
    ["flow-warp", "stn", "resample"],
)
def test_vgf_export_runs_whole(vgf_export: Any, name: str) -> None:
    export = vgf_export(name)
    io = export.io_quant_params
    inputs = [
        _quantize_input(x, e) for x, e in zip(export.example_inputs, io["inputs"], strict=True)
    ]
    program = load_program(export.pte_path)
    assert program.unsupported() == []
    result = program.run(inputs)
    _RUNS[name] = result
    backends = {c.backend_id for c in result.delegate_calls}
    assert backends == {"VgfBackend", "GridSamplerBackend"}
    converted = export.converted_model
    assert converted is not None
    with torch.no_grad():
        references = converted(*export.example_inputs)
    if isinstance(references, torch.Tensor):
        references = (references,)
    for actual, reference, entry in zip(result.outputs, references, io["outputs"], strict=True):
        assert actual.dtype == torch.int8
        assert _steps(actual, reference, entry) <= 1.0 + 1e-4  # float32 rounding near +-1
    assert result.warnings == []


@pytest.mark.parametrize("name", ["stn", "resample"])
def test_vgf_export_same_on_cpu_and_vulkan_grid_sampler(vgf_export: Any, name: str) -> None:
    export = vgf_export(name)
    io = export.io_quant_params
    inputs = [
        _quantize_input(x, e) for x, e in zip(export.example_inputs, io["inputs"], strict=True)
    ]
    on_cpu = (_RUNS.get(name) or load_program(export.pte_path).run(inputs)).outputs
    result = load_program(export.pte_path, grid_sampler_impl="vulkan").run(inputs)
    samplers = [c for c in result.delegate_calls if c.backend_id == "GridSamplerBackend"]
    assert samplers and all(c.implementation == "etkit_gridsampler.vulkan" for c in samplers)
    for actual, expected in zip(result.outputs, on_cpu, strict=True):
        assert torch.equal(actual, expected)


def test_vgf_export_constant_methods(vgf_export: Any) -> None:
    export = vgf_export("stn")
    program = load_program(export.pte_path)
    assert "input0_scale" in program.method_names
    (scale,) = program.run([], method="input0_scale").outputs
    assert scale == pytest.approx(export.io_quant_params["inputs"][0]["scale"])


def test_vgf_run_keeps_delegate_io_and_verify_holds_samplers_to_contract(vgf_export: Any) -> None:
    """``keep_delegate_io`` keeps what each delegate call read and wrote; verification's
    per-call row compares a grid-sampler call with the contract's ideal on those very inputs,
    and an output moved by two steps at one position is reported as two steps there."""
    from dataclasses import replace

    from etkit_exporter.check.verify import _delegate_row

    export = vgf_export("stn")
    io = export.io_quant_params
    inputs = [
        _quantize_input(x, e) for x, e in zip(export.example_inputs, io["inputs"], strict=True)
    ]
    program = load_program(export.pte_path)
    result = program.run(inputs, keep_delegate_io=True)
    blobs = {d.index: d.processed for d in program.method("forward").delegates}
    (call,) = [c for c in result.delegate_calls if c.backend_id == "GridSamplerBackend"]
    assert call.inputs is not None and call.outputs is not None
    assert len(call.input_indices) == len(call.inputs) == decode(blobs[call.delegate]).roles.inputs
    row = _delegate_row(call, blobs[call.delegate])
    assert row["mode"] == "bilinear" and row["max_steps_vs_ideal"] <= 1
    assert sum(row["steps_histogram"].values()) == call.outputs[0].numel()
    moved = call.outputs[0].clone()
    value = int(moved[0, 0, 1, 2])
    moved[0, 0, 1, 2] = value + 2 if value < 100 else value - 2
    broken = _delegate_row(replace(call, outputs=(moved,)), blobs[call.delegate])
    assert broken["max_steps_vs_ideal"] >= 2
    vgf_calls = [c for c in result.delegate_calls if c.backend_id == "VgfBackend"]
    assert vgf_calls and all(c.inputs is not None for c in vgf_calls)
    # by default a run keeps no delegate IO (the run test_vgf_export_runs_whole made, when it ran:
    # on VGF each run is a scenario_runner process)
    plain = _RUNS.get("stn") or load_program(export.pte_path).run(inputs)
    assert plain.delegate_calls[0].inputs is None
