"""The .pte runner on real programs written by ExecuTorch: portable and quantized kernels give
outputs identical to executorch.runtime; control flow and dynamic shapes run; a delegate runs
through a registered ``Backend`` or a Python function (an XNNPACK delegate replaced by a Python
model of its ops); bad files, bad inputs and unknown operators or backends fail with clear
errors before anything runs. Nothing of etkit but this package is imported."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# the out variants of quantized_decomposed::* that to_executorch needs (the runtime's kernels)
import executorch.kernels.quantized  # noqa: F401
import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

from etkit_pterunner import (
    DelegateCall,
    DelegateInfo,
    ExecutionError,
    ProgramInputError,
    PteFormatError,
    PteProgram,
    UnsupportedProgramError,
    chrome_trace,
    write_chrome_trace,
)

INT8 = (1 / 127, 0, -127, 127, torch.int8)


def _q(x: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.quantize_per_tensor(x, *INT8)
    return result


def _dq(x: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(x, *INT8)
    return result


def _rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) * 2 - 1


def _cl(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


class Mixed(torch.nn.Module):
    """A channels-last image quantized and dequantized by ExecuTorch's quantized kernels, a conv,
    an add and a clamp; beside it a contiguous input reshaped (an elided view that aliases its
    input's memory) and sliced."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, image: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
        source = _dq(_q(image))
        features = torch.relu(self.conv(source))
        flat = (other * 2).reshape(1, -1, 16)[:, 1:, :]
        return _q(torch.clamp(features + source, -1, 1)), torch.relu(flat)


class Lowered(torch.nn.Module):
    """A linear and an add that XNNPACK takes, between ops it leaves to the portable kernels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.linear(torch.cumsum(x, 1)) + y, 1)


class Branches(torch.nn.Module):
    """``torch.cond``: the program jumps (JumpFalseCall) and moves (MoveCall) values."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

        def minus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x - y

        chosen: torch.Tensor = torch.cond(x.sum() > 0, plus, minus, (x, y))
        return chosen * 2


class Dynamic(torch.nn.Module):
    """A dynamic batch: symbolic sizes (sym_size, et_view) and outputs resized at run time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * 2 + 1)
        return y.reshape(-1, 6) + y.shape[0]


MIXED_INPUTS = (_cl(_rand(1, 4, 8, 8)), _rand(1, 4, 8, 8))
LOWERED_INPUTS = (_rand(2, 8), _rand(2, 8))


def _write(module: torch.nn.Module, inputs: tuple[Any, ...], path: Path, **lower: Any) -> Path:
    exported = torch.export.export(module.eval(), inputs, strict=False, **lower.pop("export", {}))
    path.write_bytes(to_edge_transform_and_lower(exported, **lower).to_executorch().buffer)
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("programs")
    return {
        "mixed": _write(Mixed(), MIXED_INPUTS, folder / "mixed.pte"),
        "lowered": _write(
            Lowered(), LOWERED_INPUTS, folder / "lowered.pte", partitioner=[XnnpackPartitioner()]
        ),
    }


def _executorch(path: Path, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    outputs = Runtime.get().load_program(path).load_method("forward").execute(list(inputs))
    return [y for y in outputs if isinstance(y, torch.Tensor)]


def test_identical_to_executorch_runtime(programs: dict[str, Path]) -> None:
    expected = _executorch(programs["mixed"], MIXED_INPUTS)
    program = PteProgram.load(programs["mixed"])
    assert program.method_names == ("forward",)
    assert program.registered_backends == () and program.delegates == ()
    assert program.unsupported() == []
    result = program.run(MIXED_INPUTS)
    assert len(result.outputs) == len(expected) == 2
    assert result.outputs[0].dtype == torch.int8
    for actual, reference in zip(result.outputs, expected, strict=True):
        assert torch.equal(actual, reference)
    assert result.warnings == [] and result.delegate_calls == []
    ran = {call.operator for call in result.kernel_calls}
    assert {"quantized_decomposed::quantize_per_tensor.out", "aten::convolution.out"} <= ran


def _linear_add(lowered: Lowered) -> Any:
    """A Python model of the XNNPACK delegate's ops (the linear, then the add)."""

    def model(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        x, y = args
        with torch.no_grad():
            return [lowered.linear(x) + y]

    return model


def test_a_python_model_in_place_of_a_delegate(programs: dict[str, Path]) -> None:
    """The README's use: an XNNPACK delegate run by a Python model of its ops, its inputs told
    from its outputs by which values earlier instructions write; the result is the runtime's
    (XNNPACK's own kernels) within float rounding, and every delegate call's tensors are kept."""
    path = programs["lowered"]
    program = PteProgram.load(path)
    (delegate,) = program.delegates
    assert delegate.backend_id == "XnnpackBackend"
    issues = program.unsupported()
    assert (
        len(issues) == 1
        and "no implementation is registered for backend 'XnnpackBackend'" in (issues[0])
    )
    with pytest.raises(UnsupportedProgramError, match=r"cannot run in the \.pte runner"):
        program.run(LOWERED_INPUTS)
    module = Lowered()
    program.register_delegate("XnnpackBackend", _linear_add(module))
    result = program.run(LOWERED_INPUTS, keep_delegate_io=True)
    (expected,) = _executorch(path, LOWERED_INPUTS)
    torch.testing.assert_close(result.outputs[0], expected, rtol=1e-5, atol=1e-5)
    (call,) = result.delegate_calls
    assert call.implementation.startswith("Python function _linear_add.<locals>.model")
    assert call.inputs is not None and call.outputs is not None
    assert [tuple(t.shape) for t in call.inputs] == [(2, 8), (2, 8)]
    assert torch.equal(call.inputs[0], torch.cumsum(LOWERED_INPUTS[0], 1))

    def wrong(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        return [args[0].double()]

    program.register_delegate("XnnpackBackend", wrong)
    message = (
        r"instruction \d+: delegate 0 \(XnnpackBackend\): the Python function .*wrong returned "
        r"float64 \[2, 8\] as output 0, the program's value \d+ is float32 \[2, 8\]"
    )
    with pytest.raises(ExecutionError, match=message):
        program.run(LOWERED_INPUTS)


class Counting:
    """A ``Backend`` whose format says how many inputs: records what the runner asks."""

    label = "counting backend"

    def __init__(self, inputs: int | None, model: Any) -> None:
        self.inputs = inputs
        self.model = model
        self.asked: list[int] = []

    def num_inputs(self, delegate: DelegateInfo) -> int | None:
        self.asked.append(delegate.index)
        if self.inputs is None:
            raise ValueError("not a blob of mine")
        return self.inputs

    def execute(self, call: DelegateCall) -> str:
        (value,) = self.model(call.delegate.processed, [], call.inputs)
        call.outputs[0].copy_(value)
        return f"{self.label} ({len(call.inputs)} inputs)"


def test_backend_objects_say_their_input_count(programs: dict[str, Path]) -> None:
    """A registered ``Backend`` reads the input count; a function registered later for its
    backend id keeps that reading; a count that cannot be read is named before running."""
    model = _linear_add(Lowered())
    backend = Counting(2, model)
    program = PteProgram.load(programs["lowered"], backends={"XnnpackBackend": backend})
    assert program.registered_backends == ("XnnpackBackend",)
    assert program.backend("XnnpackBackend") is backend
    result = program.run(LOWERED_INPUTS)
    assert backend.asked == [0]
    assert result.delegate_calls[0].implementation == "counting backend (2 inputs)"

    program.register_delegate("XnnpackBackend", model)
    assert program.unsupported() == [] and backend.asked == [0, 0]
    # a count that leaves no output is refused, naming where it came from
    program.register_backend("XnnpackBackend", Counting(3, model))
    (issue,) = program.unsupported()
    assert issue.endswith(
        "3 arguments, but its processed bytes declare 3 inputs and at least 1 output"
    )
    program.register_backend("XnnpackBackend", Counting(None, model))
    (issue,) = program.unsupported()
    assert issue.endswith("cannot read its processed bytes: not a blob of mine")
    # num_outputs, given at registration, comes first
    program.register_delegate("XnnpackBackend", model, num_outputs=1)
    assert program.unsupported() == []
    with pytest.raises(TypeError, match="num_inputs"):
        program.register_backend("XnnpackBackend", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_outputs must be a positive int"):
        program.register_delegate("XnnpackBackend", model, num_outputs=0)


def test_control_flow_and_dynamic_shapes(tmp_path: Path) -> None:
    x, y = _rand(2, 3), _rand(2, 3)
    branches = _write(Branches(), (x, y), tmp_path / "cond.pte")
    program = PteProgram.load(branches)
    kinds = {i.kind for i in program.method().chains[0]}
    assert {"jump_false", "move"} <= kinds
    for sign in (1, -1):
        inputs = (sign * x.abs(), y)
        (expected,) = _executorch(branches, inputs)
        result = program.run(inputs)
        assert torch.equal(result.outputs[0], expected)
        ran = {c.operator for c in result.kernel_calls}
        assert ("aten::add.out" in ran) == (sign > 0) and ("aten::sub.out" in ran) == (sign < 0)
    batch = torch.export.Dim("batch", max=8)
    dynamic = _write(
        Dynamic(),
        (_rand(4, 2, 3),),
        tmp_path / "dynamic.pte",
        export={"dynamic_shapes": ({0: batch},)},
    )
    program = PteProgram.load(dynamic)
    assert "executorch_prim::et_view.default" in program.method().operators
    for rows in (8, 3):
        batch_input = (_rand(rows, 2, 3),)
        (expected,) = _executorch(dynamic, batch_input)
        (actual,) = program.run(batch_input).outputs
        assert actual.shape == (rows, 6) and torch.equal(actual, expected)
    with pytest.raises(ProgramInputError, match=r"shape \[8, 2, 3\] \(dynamic: at most"):
        program.run([_rand(9, 2, 3)])


class Resizing:
    """A ``Backend`` that gives its dynamic output the sizes of what it computed."""

    label = "resizing backend"

    def __init__(self, model: Any) -> None:
        self.model = model

    def num_inputs(self, delegate: DelegateInfo) -> int | None:
        return 2

    def execute(self, call: DelegateCall) -> str:
        (value,) = self.model(call.delegate.processed, [], call.inputs)
        call.resize_output(0, value.shape).copy_(value)
        return self.label


def test_dynamic_delegate_outputs_are_resized(tmp_path: Path) -> None:
    """An XNNPACK delegate in a program of dynamic batch: its inputs come with the run's sizes,
    and its output, planned at the bound, takes the sizes the Python model or the ``Backend``
    gives it (``resize_tensor``); the outputs are executorch.runtime's at every size."""
    rows = torch.export.Dim("rows", max=8)
    module = Lowered()
    path = _write(
        module,
        (_rand(4, 8), _rand(4, 8)),
        tmp_path / "dynamic_lowered.pte",
        export={"dynamic_shapes": ({0: rows}, {0: rows})},
        partitioner=[XnnpackPartitioner()],
    )
    program = PteProgram.load(path, delegates={"XnnpackBackend": _linear_add(module)})
    assert [d.backend_id for d in program.delegates] == ["XnnpackBackend"]
    method = program.method()
    assert all(method.values[i].dynamic for i in method.inputs)  # type: ignore[union-attr]
    for count in (8, 3, 5, 1):
        inputs = (_rand(count, 8), _rand(count, 8))
        (expected,) = _executorch(path, inputs)
        result = program.run(inputs, keep_delegate_io=True)
        (actual,) = result.outputs
        assert actual.shape == (count, 8)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        (call,) = result.delegate_calls
        assert call.inputs is not None and call.outputs is not None
        assert [tuple(t.shape) for t in (*call.inputs, *call.outputs)] == [(count, 8)] * 3
    program.register_backend("XnnpackBackend", Resizing(_linear_add(module)))
    inputs = (_rand(6, 8), _rand(6, 8))
    (expected,) = _executorch(path, inputs)
    torch.testing.assert_close(program.run(inputs).outputs[0], expected, rtol=1e-5, atol=1e-5)

    def too_big(processed: bytes, compile_specs: list[Any], args: list[torch.Tensor]) -> Any:
        return [torch.zeros(9, 8)]

    program.register_delegate("XnnpackBackend", too_big)
    with pytest.raises(
        ExecutionError,
        match=r"output 0: value \d+ came out with shape \[9, 8\], "
        r"past its planned bound \[8, 8\]",
    ):
        program.run(inputs)


def test_static_delegate_outputs_are_not_resized(programs: dict[str, Path]) -> None:
    program = PteProgram.load(
        programs["lowered"], backends={"XnnpackBackend": Resizing(lambda *_: [torch.zeros(1, 8)])}
    )
    message = r"output 0 \(value \d+, float32 \[2, 8\] dim order \(0, 1\)\) is static"
    with pytest.raises(ExecutionError, match=message):
        program.run(LOWERED_INPUTS)


def test_program_description_and_kept_values(programs: dict[str, Path]) -> None:
    program = PteProgram.load(programs["mixed"])
    method = program.method("forward")
    image, other = method.input_infos
    assert image.describe() == "float32 [1, 4, 8, 8] dim order (0, 2, 3, 1)"
    assert other.describe() == "float32 [1, 4, 8, 8] dim order (0, 1, 2, 3)"
    assert "quantized_decomposed::quantize_per_tensor.out" in method.operators
    with pytest.raises(ValueError, match="has no method 'backward'; its methods: forward"):
        program.method("backward")
    result = program.run(MIXED_INPUTS, keep_values=True)
    assert result.values is not None
    for index in method.inputs:
        assert result.values[index].source == "input"
    # The reshape is an elided view: no instruction writes it, it aliases its input's memory.
    aliases = [r for r in result.values.values() if r.source == "alias"]
    assert aliases and all(r.instruction is not None for r in aliases)
    for output_index, output in zip(method.outputs, result.outputs, strict=True):
        assert torch.equal(result.values[output_index].value, output)


def test_unsupported_operator_is_named_before_running(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    data = programs["mixed"].read_bytes()
    assert data.count(b"aten::relu") == 1
    path = tmp_path / "relx.pte"
    path.write_bytes(data.replace(b"aten::relu", b"aten::relX"))
    program = PteProgram.load(path)
    issues = program.unsupported()
    calls = [
        i.position
        for i in program.method().chains[0]
        if i.kind == "kernel" and program.method().operators[i.operator] == "aten::relX.out"
    ]
    assert len(issues) == len(calls) == 2
    for issue, position in zip(issues, calls, strict=True):
        assert issue == (
            f"instruction {position}: operator aten::relX.out is not supported: torch.ops has "
            "no aten.relX.out"
        )
    with pytest.raises(UnsupportedProgramError, match=r"aten::relX\.out"):
        program.run(MIXED_INPUTS)


def test_bad_files_raise_format_errors(programs: dict[str, Path], tmp_path: Path) -> None:
    data = programs["mixed"].read_bytes()
    random_bytes = tmp_path / "random.pte"
    random_bytes.write_bytes(os.urandom(4096))
    with pytest.raises(PteFormatError, match="not an ExecuTorch program"):
        PteProgram.load(random_bytes)
    for length in (len(data) // 2, 100, 20):
        truncated = tmp_path / f"truncated-{length}.pte"
        truncated.write_bytes(data[:length])
        with pytest.raises(PteFormatError, match="truncated"):
            PteProgram.load(truncated)
    other_schema = tmp_path / "et11.pte"
    other_schema.write_bytes(data[:4] + b"ET11" + data[8:])
    with pytest.raises(PteFormatError, match="schema version ET11; this runner reads ET12"):
        PteProgram.load(other_schema)
    corrupt = tmp_path / "corrupt.pte"
    corrupt.write_bytes(data[:64] + bytes(256) + data[320:])
    with pytest.raises(PteFormatError, match="corrupt") as caught:
        PteProgram.load(corrupt)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_bad_inputs_raise_before_running(programs: dict[str, Path]) -> None:
    program = PteProgram.load(programs["mixed"])
    image, other = MIXED_INPUTS
    with pytest.raises(ProgramInputError, match=r"takes 2 inputs .*got 1"):
        program.run([image])
    with pytest.raises(
        ProgramInputError, match=r"input 1: .*shape \[1, 4, 8, 8\].*got \[1, 4, 4, 16\]"
    ):
        program.run([image, other.reshape(1, 4, 4, 16)])
    with pytest.raises(ProgramInputError, match=r"input 0: the method takes float32 .*got float64"):
        program.run([image.double(), other])
    with pytest.raises(ProgramInputError, match="input 1: the method takes a tensor"):
        program.run([image, 1.0])
    with pytest.raises(TypeError, match="a list or tuple"):
        program.run(image)  # type: ignore[arg-type]


def test_layout_of_given_inputs(programs: dict[str, Path]) -> None:
    """An input given in another layout is laid out as the program declares, with a warning
    (executorch.runtime would read the given memory as it is)."""
    image, other = MIXED_INPUTS
    program = PteProgram.load(programs["mixed"])
    expected = program.run([image, other]).outputs[0]
    result = program.run([image.contiguous(), other])
    assert torch.equal(result.outputs[0], expected)
    (warning,) = result.warnings
    assert warning.startswith("input 0 was given with strides") and "channels-last" in warning


def test_chrome_trace_of_a_run(programs: dict[str, Path], tmp_path: Path) -> None:
    program = PteProgram.load(programs["lowered"])
    program.register_delegate("XnnpackBackend", _linear_add(Lowered()))
    result = program.run(LOWERED_INPUTS)
    trace = chrome_trace(result, program="lowered.pte")
    events = trace["traceEvents"]
    assert events[0]["args"]["name"] == "etkit runner: lowered.pte"
    timed = [e for e in events if e["ph"] == "X" and e["cat"] != "method"]
    assert len(timed) == len(result.kernel_calls) + len(result.delegate_calls)
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)
    (delegate,) = [e for e in timed if e["cat"] == "delegate"]
    assert delegate["name"] == "XnnpackBackend (delegate 0)"
    path = write_chrome_trace(result, tmp_path / "t" / "trace.json", program="lowered.pte")
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))
