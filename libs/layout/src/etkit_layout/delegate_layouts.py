"""``pin_delegate_layouts``: every tensor a delegate reads or writes keeps, in the serialized
program, the dim order the delegate was compiled for.

Why it is needed: ``channels_last`` sets dim orders on the fake tensors of the edge graph, and a
backend compiles each partition for the dim orders its inputs and outputs have then (the Arm VGF
backend declares an NHWC boundary as an [N, H, W, C] tensor; its runtime copies raw bytes).
But ``to_executorch`` re-traces the program (``SpecPropPass`` runs ``ExportPass``) before it
makes the tensor specs that are serialized, and a re-trace recomputes every tensor but the
placeholders from what the operators compute: a delegate's outputs from running the delegate's
original graph on fake tensors (``executorch_call_delegate``'s fake kernel). ``grid_sampler_2d``
returns contiguous tensors whatever its input, so a grid-sampler delegate's output comes back
NCHW; a VGF partition's output comes back in whatever layout its last operator gives. A layout
that lives only in fake-tensor metadata is lost, and the bytes a delegate writes are read in
another layout by the next one.

The pass runs on the program after all lowering (before ``extract_io_quant_params`` and
``to_executorch``) and makes the compiled layouts what the operators compute:

- a delegate output that its original graph would compute in another layout gets a
  ``dim_order_ops._clone_dim_order`` to the compiled layout appended in that original graph
  (which only fake propagation and debugging read: the delegate's compiled payload is untouched
  and nothing is added to what runs);
- a delegate input whose producer (an operator left to the portable kernels) computes another
  layout gets a ``_clone_dim_order`` in the program, the one layout copy that is then needed
  (not for delegates of ``any_layout_backends``, which index through strides);

and writes the re-traced fake tensors into the program's nodes, so that their dim orders are
the serialized ones.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument
from torch.fx import GraphModule, Node

logger = logging.getLogger(__name__)


class TensorSpecLike(Protocol):
    """What is read of ExecuTorch's ``TensorSpec`` (the serialized layout of a tensor)."""

    @property
    def dim_order(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class LayoutFix:
    """One change: the delegate (its ``lowered_module`` attribute name and backend), which of
    its inputs or outputs, and the dim order it now has in the program."""

    delegate: str
    backend_id: str
    kind: Literal["input", "output"]  # output: pinned in the delegate's graph; input: a copy
    index: int
    dim_order: tuple[int, ...]

    def describe(self) -> str:
        where = "pinned in its graph" if self.kind == "output" else "copied into it before the call"
        return (
            f"{self.delegate} ({self.backend_id}) {self.kind} {self.index}: dim order "
            f"{list(self.dim_order)} {where}"
        )


@dataclass(frozen=True)
class PinResult:
    """What ``pin_delegate_layouts`` changed (empty when every layout already held)."""

    fixes: tuple[LayoutFix, ...] = field(default=())

    @property
    def modified(self) -> bool:
        return bool(self.fixes)

    @property
    def copies(self) -> tuple[LayoutFix, ...]:
        """The layout copies inserted into the program (each one runs)."""
        return tuple(f for f in self.fixes if f.kind == "input")


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape lie the same way in memory: equal strides on every
    dimension longer than 1 (a dimension of size 1 has no stride that matters, so NCHW and
    NHWC are one layout when C is 1)."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    return all(
        size == 1 or sa == sb for size, sa, sb in zip(a.shape, a.stride(), b.stride(), strict=True)
    )


def _clone_dim_order() -> Any:
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge.dim_order_ops._clone_dim_order.default


def _is_delegate_call(node: Node) -> bool:
    from executorch.exir.delegate import executorch_call_delegate

    return node.op == "call_function" and node.target is executorch_call_delegate


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def compiled_inputs(lowered: Any) -> list[torch.Tensor | None]:
    """The fake tensors a lowered module's user inputs had when it was compiled, in call order
    (``None`` for an input that is not a tensor)."""
    program: ExportedProgram = lowered.original_module
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    result: list[torch.Tensor | None] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders.get(spec.arg.name) if isinstance(spec.arg, TensorArgument) else None
        value = node.meta.get("val") if node is not None else None
        result.append(value if isinstance(value, torch.Tensor) else None)
    return result


def _output_args(program: ExportedProgram) -> list[Any]:
    output = program.graph.output_node()
    args = output.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def compiled_outputs(lowered: Any) -> list[torch.Tensor | None]:
    """The fake tensors a lowered module's outputs had when it was compiled."""
    result: list[torch.Tensor | None] = []
    for arg in _output_args(lowered.original_module):
        value = arg.meta.get("val") if isinstance(arg, Node) else None
        result.append(value if isinstance(value, torch.Tensor) else None)
    return result


def _pin_output(program: ExportedProgram, index: int, dim_order: Sequence[int]) -> None:
    """Makes output ``index`` of ``program`` (a delegate's original graph) compute
    ``dim_order``: a ``_clone_dim_order`` between the tensor and the output."""
    graph = program.graph
    output = graph.output_node()
    args = _output_args(program)
    source = args[index]
    if not isinstance(source, Node):
        raise ValueError(f"output {index} of the delegate's graph is not a tensor")
    with graph.inserting_before(output):
        clone = graph.call_function(_clone_dim_order(), (source,), {"dim_order": list(dim_order)})
    clone.meta.update({k: v for k, v in source.meta.items() if k != "debug_handle"})
    args[index] = clone
    outputs = output.args[0]
    output.args = (type(outputs)(args) if isinstance(outputs, (list, tuple)) else clone,)
    specs = program.graph_signature.output_specs
    if index >= len(specs) or not isinstance(specs[index].arg, TensorArgument):
        raise ValueError(f"the delegate's graph signature has no tensor output {index}")
    specs[index].arg = TensorArgument(name=clone.name)
    program.graph_module.recompile()


def _fake_mode(graph_module: GraphModule) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and isinstance(value, FakeTensor):
            return value.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


class _Propagation:
    """Fake propagation of the top-level graph, node by node, as ``ExportPass`` re-traces it,
    fixing delegate layouts on the way."""

    def __init__(self, program: ExportedProgram, any_layout_backends: Collection[str]) -> None:
        self.program = program
        self.graph_module = program.graph_module
        self.any_layout = frozenset(any_layout_backends)
        self.values: dict[Node, Any] = {}
        self.fixes: list[LayoutFix] = []

    def value(self, arg: Any) -> Any:
        return torch.fx.node.map_arg(arg, lambda n: self.values[n])

    def run(self) -> None:
        for node in list(self.graph_module.graph.nodes):
            if node.op == "placeholder":
                self.values[node] = node.meta.get("val")
            elif node.op == "get_attr":
                self.values[node] = _fetch_attr(self.graph_module, str(node.target))
            elif node.op == "call_function":
                if _is_delegate_call(node):
                    self._delegate(node)
                else:
                    self._compute(node)
            elif node.op == "output" and "val" in node.meta:
                node.meta["val"] = self.value(node.args[0])

    def _compute(self, node: Node) -> None:
        args, kwargs = self.value(node.args), self.value(node.kwargs)
        target: Any = node.target  # an operator, operator.getitem or a higher-order op
        value = target(*args, **kwargs)
        self.values[node] = value
        if _tensors(value):
            node.meta["val"] = value

    def _delegate(self, node: Node) -> None:
        from executorch.exir.delegate import executorch_call_delegate

        module_node = node.args[0]
        assert isinstance(module_node, Node)
        name = str(module_node.target)
        lowered = self.values[module_node]
        backend = str(lowered.backend_id)
        if backend not in self.any_layout:
            for k, (arg, expected) in enumerate(
                zip(node.args[1:], compiled_inputs(lowered), strict=False)
            ):
                if not isinstance(arg, Node) or expected is None:
                    continue
                given = self.values[arg]
                if isinstance(given, torch.Tensor) and not same_layout(given, expected):
                    self._copy_input(node, arg, expected, name, backend, k)
        args = self.value(node.args[1:])
        outputs = _tensors_or_none(executorch_call_delegate(lowered, *args))
        pinned = False
        for k, (actual, expected) in enumerate(
            zip(outputs, compiled_outputs(lowered), strict=True)
        ):
            if actual is None or expected is None or same_layout(actual, expected):
                continue
            order = tuple(int(d) for d in expected.dim_order())
            _pin_output(lowered.original_module, k, order)
            self.fixes.append(LayoutFix(name, backend, "output", k, order))
            logger.debug("layout: %s", self.fixes[-1].describe())
            pinned = True
        if pinned:
            outputs = _tensors_or_none(executorch_call_delegate(lowered, *args))
        self.values[node] = outputs
        node.meta["val"] = outputs

    def _copy_input(
        self, call: Node, arg: Node, expected: torch.Tensor, name: str, backend: str, index: int
    ) -> None:
        order = tuple(int(d) for d in expected.dim_order())
        graph = self.graph_module.graph
        with graph.inserting_before(call):
            copy = graph.call_function(_clone_dim_order(), (arg,), {"dim_order": list(order)})
        copy.meta.update({k: v for k, v in arg.meta.items() if k not in ("val", "debug_handle")})
        args = list(call.args)
        args[1 + index] = copy  # this argument only: another may take ``arg`` as it is
        call.args = tuple(args)
        self._compute(copy)
        fix = LayoutFix(name, backend, "input", index, order)
        self.fixes.append(fix)
        logger.warning(
            "layout: %s: its producer %s computes another layout, so a layout copy runs there",
            fix.describe(),
            arg.name,
        )


def _tensors_or_none(value: object) -> list[torch.Tensor | None]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v if isinstance(v, torch.Tensor) else None for v in items]


def _fetch_attr(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def pin_delegate_layouts(
    program: ExportedProgram, *, any_layout_backends: Collection[str] = ()
) -> PinResult:
    """Makes the dim order of every tensor a delegate of ``program``'s top-level graph reads or
    writes survive ``to_executorch``, so that the serialized program lays each tensor out as
    its producer writes it and its consumer reads it (see the module docstring). Run it on the
    lowered program (``EdgeProgramManager.exported_program()``) after the last ``to_backend``
    and before ``to_executorch``; it changes the program in place and returns what it changed.

    A delegate output is pinned to the layout the delegate was compiled for (the fake tensor of
    its original graph's output), which costs nothing at run time. A delegate input whose
    producer is an operator left outside delegates and computes another layout gets a copy
    (``dim_order_ops._clone_dim_order``) before the call, except for delegates whose backend id
    is in ``any_layout_backends`` (backends that read and write any dim order through the
    strides, such as etkit's grid sampler), which take their inputs as they come. Afterwards
    each node's fake tensor is the one the re-trace of ``to_executorch`` computes, so its dim
    order is the serialized one. Running it again changes nothing."""
    from torch._dispatch.python import enable_python_dispatcher

    propagation = _Propagation(program, any_layout_backends)
    mode = _fake_mode(program.graph_module)
    allowed = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        with mode, enable_python_dispatcher():
            propagation.run()
    finally:
        mode.allow_non_fake_inputs = allowed
    if propagation.fixes:
        program.graph_module.graph.lint()
        program.graph_module.recompile()
    return PinResult(tuple(propagation.fixes))


def _program_tensor(node: Node) -> torch.Tensor | TensorSpecLike | None:
    spec = node.meta.get("spec")
    if spec is not None and hasattr(spec, "dim_order"):
        return spec  # type: ignore[no-any-return]
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def delegate_layout_mismatches(
    program: ExportedProgram, *, any_layout_backends: Collection[str] = ()
) -> list[str]:
    """Each tensor of ``program``'s top-level graph that a delegate reads or writes in another
    layout than the one it was compiled for, described in a sentence (empty: every layout
    agrees). The program's layout of a tensor is its tensor spec's dim order (what is
    serialized) where ``to_executorch`` has made specs, else its fake tensor's. Inputs of
    delegates whose backend is in ``any_layout_backends`` may have any layout."""
    graph_module = program.graph_module
    problems: list[str] = []
    for node in graph_module.graph.nodes:
        if not _is_delegate_call(node):
            continue
        module_node = node.args[0]
        assert isinstance(module_node, Node)
        name = str(module_node.target)
        lowered = _fetch_attr(graph_module, name)
        backend = str(lowered.backend_id)
        pairs: list[tuple[str, Node, torch.Tensor | None]] = []
        if backend not in any_layout_backends:
            pairs += [
                (f"input {k}", arg, expected)
                for k, (arg, expected) in enumerate(
                    zip(node.args[1:], compiled_inputs(lowered), strict=False)
                )
                if isinstance(arg, Node)
            ]
        getitems = {
            user.args[1]: user
            for user in node.users
            if user.target is operator.getitem and isinstance(user.args[1], int)
        }
        pairs += [
            (f"output {k}", getitems[k], expected)
            for k, expected in enumerate(compiled_outputs(lowered))
            if k in getitems
        ]
        for what, arg, expected in pairs:
            actual = _program_tensor(arg)
            if expected is None or actual is None:
                continue
            compiled = _dim_order(expected)
            found = _dim_order(actual)
            if not _equivalent(compiled, found, tuple(expected.shape)):
                problems.append(
                    f"{name} ({backend}) {what} was compiled for dim order {list(compiled)}, "
                    f"the program's tensor {arg.name} has {list(found)}"
                )
    return problems


def _dim_order(value: torch.Tensor | TensorSpecLike) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(int(d) for d in value.dim_order())
    return tuple(int(d) for d in value.dim_order)


def _equivalent(a: Sequence[int], b: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether two dim orders lay a tensor of ``shape`` out alike (dimensions of size 1 do
    not count)."""
    return [d for d in a if shape[d] != 1] == [d for d in b if shape[d] != 1]
