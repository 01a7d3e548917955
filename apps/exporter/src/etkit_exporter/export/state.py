"""A recurrent model's state: what a frame hands the next (docs/how-to/state.md).

A model keeps a state across frames in one of two ways, and an export carries both the same
way, as pairs of the program's own inputs and outputs that an engine ping-pongs between frames:

- it takes the state as an input and returns its new value (the Model Gym's NSS step): the
  caller names each pair (``state={"history": "new_history"}``, ``--state
  history=new_history``);
- it registers a buffer and writes it in ``forward`` (``self.history.copy_(out)``): etkit finds
  each buffer a forward writes (``written_buffers``) and lifts it (``lift_buffers``): the buffer
  becomes an input named after it and its new value an output ``new_<name>``, the in-place
  writes made functional, the buffer's value when exported the initial state.

Each pair's input and output carry the same quantization parameters, exactly
(``shared_state_qspec``: one fixed qspec over what both held in calibration), so an output
copied into the next frame's input needs no conversion; io_quant_params.json names the pairs
(``state_table``). Calibration runs sequences with the model's own state fed back
(``sequence_samples``), so a state is observed over the whole run, not on its first frame.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from etkit_exporter.check.loop import loop_frames, verify_loop
from etkit_exporter.export.arguments import check_forward
from etkit_quant import ObservedRange, fixed, is_fixed, value_qspec

Frame = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class StatePair:
    """Input ``input`` (named ``input_name``) takes what output ``output`` (``output_name``)
    returned the frame before."""

    input: int
    output: int
    input_name: str
    output_name: str
    buffer: str | None = None  # the buffer it was lifted from (``lift_buffers``)


@dataclass(frozen=True)
class ModelState:
    """The state pairs of a model, and the buffers etkit lifted into them (empty when the caller
    named the pairs)."""

    pairs: tuple[StatePair, ...]
    lifted: tuple[str, ...] = ()

    @property
    def index_pairs(self) -> tuple[tuple[int, int], ...]:
        """(input, output) of each pair (``QuantOptions.state``)."""
        return tuple((p.input, p.output) for p in self.pairs)

    @property
    def inputs(self) -> dict[int, int]:
        """Output index by state input index."""
        return {p.input: p.output for p in self.pairs}

    def feed_back(self, frame: Frame, outputs: Sequence[torch.Tensor]) -> Frame:
        """``frame``'s inputs with each state input replaced by its output in ``outputs``."""
        feeds = self.inputs
        return tuple(outputs[feeds[k]].detach() if k in feeds else x for k, x in enumerate(frame))


def input_names(model: torch.nn.Module, count: int) -> list[str]:
    """The names of ``model.forward``'s first ``count`` positional parameters (``input_K`` where
    it takes ``*args``)."""
    names: list[str] = []
    for parameter in inspect.signature(model.forward).parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
    names = names[:count]
    return names + [f"input_{k}" for k in range(len(names), count)]


def output_names_of(value: Any) -> list[str]:
    """The names ``core.io_params.output_names`` gives the outputs a forward returned: a dict's
    keys, a named tuple's fields, else ``output_K``."""
    leaves, spec = pytree.tree_flatten(value)
    if spec.num_leaves == spec.num_children == len(leaves):
        if spec.type is dict:
            return [str(k) for k in spec.context]
        fields = getattr(spec.type, "_fields", None)
        if fields:
            return [str(f) for f in fields]
    return [f"output_{k}" for k in range(len(leaves))]


def _leaves(value: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def check_state(state: object, model: torch.nn.Module, inputs: Frame) -> ModelState | None:
    """``state`` (input name -> output name, as ``export_model(state=...)`` takes it) resolved
    against the model's forward (its parameter names) and what it returns on ``inputs`` (its
    output names). One line for a name the model does not have, a pair whose shapes or dtypes
    differ, or an output or input named twice."""
    if state is None or (isinstance(state, Mapping) and not state):
        return None
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in state.items()
    ):
        raise TypeError(
            f"state must map input names to output names (e.g. {{'history': 'new_history'}}), "
            f"got {state!r}"
        )
    check_forward(model, inputs)  # the forward's own error, in one line
    with torch.no_grad():
        returned = model(*inputs)
    outputs = _leaves(returned)
    out_names = output_names_of(returned)
    in_names = input_names(model, len(inputs))
    pairs = []
    for name_in, name_out in state.items():
        if name_in not in in_names:
            raise ValueError(
                f"state names input {name_in!r}, which the model does not take; its inputs: "
                f"{', '.join(in_names)}"
            )
        if name_out not in out_names:
            raise ValueError(
                f"state names output {name_out!r}, which the model does not return; its "
                f"outputs: {', '.join(out_names)} (name outputs by returning a dict)"
            )
        k, j = in_names.index(name_in), out_names.index(name_out)
        x, y = inputs[k], outputs[j]
        if x.shape != y.shape or x.dtype != y.dtype:
            raise ValueError(
                f"state pair {name_in}={name_out}: the input is {_describe(x)}, the output "
                f"{_describe(y)}; a state's output must have its input's shape and dtype"
            )
        pairs.append(StatePair(k, j, name_in, name_out))
    for what, used in (("output", [p.output for p in pairs]), ("input", [p.input for p in pairs])):
        if len(set(used)) != len(used):
            raise ValueError(f"state names an {what} twice: each state has one input and output")
    return ModelState(tuple(pairs))


def _describe(x: torch.Tensor) -> str:
    return f"{'x'.join(map(str, x.shape))} {str(x.dtype).removeprefix('torch.')}"


def written_buffers(model: torch.nn.Module, inputs: Frame) -> list[str]:
    """The buffers one forward of ``model`` on ``inputs`` writes in place, found on copies (the
    model's own buffers are left as they were); none when the forward fails (the export's
    ``check_forward`` then says why, in one line)."""
    copies = {name: b.detach().clone() for name, b in model.named_buffers()}
    versions = {name: c._version for name, c in copies.items()}
    try:
        with torch.no_grad():
            torch.func.functional_call(model, copies, inputs)
    except Exception:  # the forward's own error: check_forward says it in one line
        return []
    return [name for name, c in copies.items() if c._version != versions[name]]


class _Lifted(torch.nn.Module):
    """``model`` with the buffers ``names`` taken as its last inputs and their new values
    returned after its outputs (a dict: the model's output names, then ``new_<name>``)."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str], count: int) -> None:
        super().__init__()
        self.model, self.names, self.count = model, list(names), count

    def forward(self, *args: torch.Tensor) -> dict[str, torch.Tensor]:
        given = zip(self.names, args[self.count :], strict=True)
        states = {name: value.clone() for name, value in given}
        returned = torch.func.functional_call(self.model, states, args[: self.count])
        result = dict(zip(output_names_of(returned), _leaves(returned), strict=True))
        for name in self.names:
            result[f"new_{_identifier(name)}"] = states[name]
        return result


def _identifier(name: str) -> str:
    return name.replace(".", "_")


def lift_buffers(
    model: torch.nn.Module, inputs: Frame
) -> tuple[torch.nn.Module, Frame, ModelState] | None:
    """``model`` with every buffer its forward writes lifted into a state pair (module
    docstring), its example inputs followed by each buffer's present value, and the pairs; None
    when the forward writes no buffer. The returned module is a functional graph (its in-place
    writes made functional by ``torch.export``) whose inputs are named after the forward's
    parameters and the buffers."""
    names = written_buffers(model, inputs)
    if not names:
        return None
    buffers = dict(model.named_buffers())
    initial = tuple(buffers[name].detach().clone() for name in names)
    lifted_inputs = (*inputs, *initial)
    exported = torch.export.export(
        _Lifted(model, names, len(inputs)), lifted_inputs, strict=False
    ).run_decompositions({})  # functional: each in-place write a new value
    module = exported.module()
    assert isinstance(module, torch.fx.GraphModule)
    _drop_copies(module)
    in_names = [*input_names(model, len(inputs)), *(_identifier(n) for n in names)]
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, in_names, strict=True):
        node.name = node.target = name
    module.recompile()
    with torch.no_grad():
        out_names = output_names_of(module(*lifted_inputs))
    count = len(inputs)
    pairs = tuple(
        StatePair(count + k, out_names.index(f"new_{_identifier(n)}"), in_names[count + k],
                  f"new_{_identifier(n)}", n)
        for k, n in enumerate(names)
    )  # fmt: skip
    return _Named(module, in_names), lifted_inputs, ModelState(pairs, tuple(names))


class _Named(torch.nn.Module):
    """A lifted graph with a forward whose parameters carry its inputs' names (what io tables
    and ``--state`` read)."""

    def __init__(self, graph: torch.fx.GraphModule, names: Sequence[str]) -> None:
        super().__init__()
        self.graph_module = graph
        namespace: dict[str, Any] = {}
        params = ", ".join(names)
        exec(  # a forward with these parameter names, nothing else
            f"def forward(self, {params}):\n    return self.graph_module({params})\n", namespace
        )
        self.forward = namespace["forward"].__get__(self)

    def train(self, mode: bool = True) -> _Named:
        """The graph is an inference graph: its mode is this module's flag alone (an exported
        graph refuses ``train()``)."""
        self.training = mode
        return self


def _drop_copies(module: torch.fx.GraphModule) -> None:
    """Replaces each functional ``copy(dst, src)`` the write-backs left with ``src`` (of
    ``dst``'s shape and dtype, or expanded and cast to them)."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy.default:
            continue
        dst, src = node.args[0], node.args[1]
        d, s = dst.meta.get("val"), src.meta.get("val")
        replacement: Any = src
        if not (isinstance(d, torch.Tensor) and isinstance(s, torch.Tensor)) or (
            d.shape != s.shape or d.dtype != s.dtype
        ):
            with graph.inserting_before(node):
                replacement = graph.call_function(
                    torch.ops.aten.expand_copy.default,
                    (src, list(dst.meta["val"].shape)),
                )
                replacement = graph.call_function(
                    torch.ops.aten._to_copy.default, (replacement,),
                    {"dtype": dst.meta["val"].dtype},
                )  # fmt: skip
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()


def frames_of(calibration: Iterable[Any]) -> list[list[Frame]]:
    """Calibration data of a model with state as sequences: a list of frames (tuples of input
    tensors) is one sequence, a list of lists of frames several."""
    sequences: list[list[Frame]] = []
    loose: list[Frame] = []
    for item in calibration:
        if isinstance(item, tuple):
            loose.append(item)
        elif isinstance(item, list | Sequence) and all(isinstance(f, tuple) for f in item):
            sequences.append(list(item))
        else:
            raise TypeError(
                "calibration of a model with state: give frames (tuples of input tensors, one "
                f"sequence) or sequences of them (lists of tuples), got {type(item).__name__}"
            )
    if loose and sequences:
        raise TypeError("calibration mixes frames and sequences: give one or the other")
    return sequences or ([loose] if loose else [])


def with_initial_state(frame: Frame, state: ModelState, initial: Frame) -> Frame:
    """A frame of a lifted model's sequence (its own inputs only) with the initial state
    appended; a frame that already has every input is returned as it is."""
    if state.lifted and len(frame) == len(initial) - len(state.pairs):
        return (*frame, *(initial[p.input] for p in state.pairs))
    return frame


def sequence_samples(
    model: torch.nn.Module, sequences: Sequence[Sequence[Frame]], state: ModelState
) -> tuple[list[Frame], list[int]]:
    """Every frame of ``sequences`` with its state inputs as the float ``model`` fed them back
    (the first frame's as given), and each sample's frame number."""
    samples: list[Frame] = []
    numbers: list[int] = []
    with torch.no_grad():
        for sequence in sequences:
            carried: Frame | None = None
            for number, frame in enumerate(sequence):
                if carried is not None:
                    frame = tuple(
                        carried[k] if k in state.inputs else x for k, x in enumerate(frame)
                    )
                samples.append(frame)
                numbers.append(number)
                carried = state.feed_back(frame, _leaves(model(*frame)))
    return samples, numbers


def shared_state_qspec(ranges: Sequence[ObservedRange]) -> QuantizationSpec | None:
    """The one fixed qspec of a state's input and output: SNORM8 where everything both held lies
    in [-1, 1] (at least half of it used), else int8 whose scale and zero point cover the union
    of both ranges and zero (as a min-max observer would choose over both). None for a state
    that is not floating point."""
    if not all(r.dtype.is_floating_point for r in ranges):
        return None
    seen = [r for r in ranges if r.count > r.nonfinite]
    low = min([0.0, *(r.min for r in seen)])
    high = max([0.0, *(r.max for r in seen)])
    preset = value_qspec(seen)  # the library's own rule: SNORM8, or observed int8
    if is_fixed(preset):
        return preset
    scale = (high - low) / 255 if high > low else 1.0
    scale = scale if math.isfinite(scale) and scale > 0 else 1.0
    zero_point = int(min(127, max(-128, round(-128 - low / scale))))
    return fixed(float(scale), zero_point, torch.int8, -128, 127)


def state_table(state: ModelState, io_params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """io_quant_params.json's ``state``: each pair by name and index, and whether its output
    goes back into its input as it is (same dtype, scale, zero point, range and layout).
    Raises ``ValueError`` for a pair that would need a conversion: etkit never writes one."""
    table = []
    keys = ("dtype", "scale", "zero_point", "quant_min", "quant_max", "shape", "dim_order")
    for pair in state.pairs:
        source, target = io_params["outputs"][pair.output], io_params["inputs"][pair.input]
        differs = [k for k in keys if source.get(k) != target.get(k)]
        if differs:
            raise ValueError(
                f"state {pair.input_name}={pair.output_name}: the program's output and input "
                f"differ in {', '.join(differs)}; etkit writes no state that needs converting"
            )
        table.append(
            {
                "input": pair.input_name,
                "input_index": pair.input,
                "output": pair.output_name,
                "output_index": pair.output,
                "copy_as_is": True,
                **({"lifted_buffer": pair.buffer} if pair.buffer else {}),
            }
        )
    return table


def share_state_qspecs(
    input_qspecs: Sequence[QuantizationSpec | None],
    output_qspecs: Sequence[QuantizationSpec | None],
    inputs: Sequence[ObservedRange],
    outputs: Sequence[ObservedRange],
    pairs: Sequence[tuple[int, int]],
    given_inputs: Sequence[QuantizationSpec | None] | None = None,
) -> tuple[tuple[QuantizationSpec | None, ...], tuple[QuantizationSpec | None, ...]]:
    """Each state pair's input and output given one qspec: the caller's fixed one for the input
    where given (``None`` there: the state stays float), else ``shared_state_qspec`` over what
    both held in calibration. Every output that is the same tensor as a state's output gets it
    too (a model that returns its new history as its image)."""
    ins, outs = list(input_qspecs), list(output_qspecs)
    for k, j in pairs:
        given = given_inputs[k] if given_inputs is not None else None
        if given_inputs is not None and given is None:
            chosen = None
        elif given is not None and is_fixed(given):
            chosen = given
        else:
            chosen = shared_state_qspec([inputs[k], outputs[j]])
        ins[k] = chosen
        for i, observed in enumerate(outputs):
            if i == j or observed.node == outputs[j].node:
                outs[i] = chosen
    return tuple(ins), tuple(outs)


@dataclass(frozen=True)
class StatefulExport:
    """What an export of a model with state works on: the model (its buffers lifted), its
    example inputs (state inputs included), the pairs, the calibration samples with the state
    fed back (None: the example alone), and the frames the loop verdict runs."""

    model: torch.nn.Module
    inputs: Frame
    state: ModelState
    samples: list[Frame]
    frames: list[Frame]
    frames_given: int


def prepare_state(
    model: torch.nn.Module,
    inputs: Frame,
    state: object,
    calibration: Iterable[Any] | None,
    sequence: Sequence[Frame] | None,
    frames: int,
) -> StatefulExport | None:
    """The model's state found (written buffers, lifted) and named (``state``, checked), its
    calibration run as sequences with the state fed back, the loop's frames chosen (``sequence``,
    else the first calibration sequence, else the example; held to ``frames``). None for a model
    without state. One line for a frame of a sequence with a missing input."""
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f"loop_frames must be a whole number of frames, 1 or more, got {frames!r}")
    lifted = lift_buffers(model, inputs)
    found = None
    if lifted is not None:
        model, inputs, found = lifted
    named = check_state(state, model, inputs)
    if found is None and named is None:
        return None
    pairs = (*(found.pairs if found else ()), *(named.pairs if named else ()))
    model_state = ModelState(pairs, found.lifted if found else ())
    if len({p.input for p in pairs}) != len(pairs):
        raise ValueError(
            "state names a lifted buffer's input again: a buffer written in forward is a state "
            "already; name only the pairs the model takes as inputs"
        )
    sequences = frames_of(calibration) if calibration is not None else [[inputs]]
    sequences = [[with_initial_state(f, model_state, inputs) for f in s] for s in sequences]
    if sequence is not None:
        loop = [with_initial_state(f, model_state, inputs) for f in frames_of(sequence)[0]]
    else:
        loop = sequences[0] if sequences and sequences[0] else [inputs]
    for where, seq in [*((f"calibration sequence {n}", s) for n, s in enumerate(sequences)),
                       ("the loop's sequence", loop)]:  # fmt: skip
        for number, frame in enumerate(seq):
            if len(frame) != len(inputs):
                raise ValueError(
                    f"{where}, frame {number}: {len(frame)} inputs where the model takes "
                    f"{len(inputs)}; give every input of every frame"
                )
    samples, _ = sequence_samples(model, sequences, model_state)
    held, given = loop_frames(loop, frames)
    return StatefulExport(model, inputs, model_state, samples, held, given)


def check_state_export(qat: bool, sizes: object, dynamic_size: object) -> None:
    """Refuses, in one line, what an export of a model with state does not carry yet."""
    if qat:
        raise ValueError(
            "a QAT-trained model with state: export its state pairs after training from the "
            "float model (state=) is not supported yet; export the float model with calibration"
        )
    if sizes is not None or dynamic_size is not None:
        raise ValueError(
            "a model with state exports at one size (its state's): give example inputs at the "
            "size it runs, without sizes= or dynamic_size="
        )


def verify_state_loop(
    work: Path,
    model: torch.nn.Module,
    converted: torch.nn.Module,
    stateful: StatefulExport,
    io_params: dict[str, Any],
    target: str,
    tolerance: Any,
    quant: Any,
    stages: Any,
    verification: dict[str, Any],
) -> None:
    """Stage verify_loop: the loop verdict (``check.loop``) into ``verification["loop"]``; a
    failing loop fails the verdict, naming the first frame and output that left the
    envelope."""
    with stages.stage("verify_loop"):
        section = verify_loop(
            work / "model.pte", model, converted, stateful.frames, stateful.state, io_params,
            target, given=stateful.frames_given, tolerance=tolerance,
            float_export=not quant.enabled, pictures=work, progress=stages.progress,
        )  # fmt: skip
    verification["loop"] = section
    verdict = verification.setdefault("verdict", {})
    if section["result"] == "fail":
        verdict["result"] = "fail"
        verdict["loop_divergence"] = section["first_failure"]
