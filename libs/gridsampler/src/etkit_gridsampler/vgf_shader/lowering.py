"""Putting etkit's grid samplers into the VGF: which samplers go in (``VgfSamplerPartitioner``),
and the pass that turns each into a TOSA ``CUSTOM`` op carrying etkit's shader
(``sampler_lowering``), inserted into the Arm backend's pass pipeline before its own grid-sampler
passes, which then never see etkit's samplers (no SNORM clamp, no int8 grid, no grid dequantize).
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Final

import torch
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx import Node

from etkit_gridsampler.op import MODE_NAMES, PADDING_NAMES, GridSampleOp, QParams
from etkit_gridsampler.partitioner import UnsupportedGridSamplerError, unit_of
from etkit_gridsampler.plan import UnsupportedOpError
from etkit_gridsampler.vgf_shader import _arm, payload
from etkit_gridsampler.vgf_shader.payload import (
    DOMAIN,
    OPERATOR_NAME,
    PARAMS_MODES,
    ParamsMode,
    PayloadError,
    build_segment,
    byte_size_reason,
    padded_channels,
)
from etkit_quant.graph import is_dequantize, is_grid_sampler, is_quantize

logger = logging.getLogger(__name__)

IN_VGF: Final = "vgf-compute-segment"
OWN_DELEGATE: Final = "etkit-delegate"
_TAG: Final = "delegation_tag"
_NHWC: Final = [0, 2, 3, 1]
_NCHW: Final = [0, 3, 1, 2]
_PENDING_KEY: Final = "etkit_pending_segment"


@dataclass(frozen=True)
class SamplerPath:
    """Where one grid sampler went: ``IN_VGF`` (a compute segment of the VGF, etkit's shader)
    or ``OWN_DELEGATE`` (left to etkit's grid-sampler delegate), and why not in the VGF."""

    node: str
    path: str
    reason: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"node": self.node, "path": self.path, "reason": self.reason}


def vgf_reason(node: Node) -> str | None:
    """Why the grid sampler ``node`` (edge or ATen dialect, with its dequantize/quantize
    neighbours) cannot be a compute segment inside the VGF, or ``None`` when it can."""
    try:
        unit = unit_of(node)
    except UnsupportedGridSamplerError as error:
        return str(error)
    if unit.is_dynamic:
        return (
            "its sizes are dynamic (torch.export Dims): a VGF is compiled for one size "
            "(model-converter 0.11 has no dynamic dimensions); etkit's delegate takes the "
            "runtime size"
        )
    op = unit.op
    if op.is_float or op.image is None or op.grid is None:
        return "a float grid sampler has no integer contract; etkit's delegate runs it"
    if op.output is None:
        return "its output is float (only int8 -> int8 samplers become compute segments)"
    channels = padded_channels(unit.image_shape, unit.grid_shape, op.grid.dtype)
    if channels is None:
        return byte_size_reason(unit.image_shape, unit.grid_shape, op.grid.dtype)
    from etkit_gridsampler import vulkan

    n, _, h, w = unit.image_shape
    try:
        vulkan.dispatch((n, channels, h, w), unit.grid_shape, op, channels_last=True)
    except (UnsupportedOpError, ValueError) as error:
        return f"etkit's Vulkan kernel cannot run it: {error}"
    return None


def _layout_chain(node: Node) -> list[Node]:
    """``node`` and the nodes it copies through layout-only ops (permutes, views, slices,
    clones, dim-order copies), up to the first node that computes: the ops that Arm's TOSA
    lowering may fold into the memory layout of one tensor (a slice of the whole tensor
    included; a real slice is a TOSA op, and the copy made for it is one pass too many, not a
    wrong program)."""
    chain = [node]
    while chain[-1].op == "call_function" and chain[-1].target in _layout_ops():
        source = chain[-1].args[0]
        if not isinstance(source, Node):
            break
        chain.append(source)
    return chain


@cache
def _layout_ops() -> frozenset[object]:
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge
    return frozenset(
        {
            edge.aten.permute_copy.default,
            edge.aten.view_copy.default,
            edge.aten.slice_copy.Tensor,  # a slice of the whole tensor folds away
            edge.aten.squeeze_copy.dims,
            edge.aten.unsqueeze_copy.default,
            edge.aten.alias_copy.default,
            edge.aten.clone.default,
            edge.dim_order_ops._to_dim_order_copy.default,
            edge.dim_order_ops._clone_dim_order.default,
        }
    )


class VgfSamplerPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
    """Wraps ``VgfPartitioner``: the VGF keeps each grid sampler that can be a compute segment
    (``vgf_reason`` is ``None``) and gives up the others with their adjacent dequantize and
    quantize nodes, for etkit's own delegate. ``paths`` records each sampler's way."""

    def __init__(self, inner: Partitioner) -> None:
        super().__init__(getattr(inner, "_spec", {}))
        self.inner = inner
        self.paths: list[SamplerPath] = []

    @property
    def delegation_spec(self) -> Any:
        return getattr(self.inner, "delegation_spec", None)

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        ops, inner_filter = self.inner.ops_to_not_decompose(ep)

        def keep(node: Node) -> bool:
            if is_grid_sampler(node):
                # No decomposition exists for it: it stays whole either way. Kept off the
                # must-be-delegated list, since which backend takes it is decided only once the
                # partitions are known (``partition``: a sampler with too few bytes, say).
                return False
            return inner_filter(node) if inner_filter is not None else True

        return ops, keep

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        result: ExportedProgram = self.inner.transform_for_pre_decomposition(exported_program)
        return result

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = self.inner.partition(exported_program)
        program = result.tagged_exported_program
        self.paths = []
        for node in program.graph_module.graph.nodes:
            if not is_grid_sampler(node):
                continue
            reason = vgf_reason(node)
            if reason is None and _TAG not in node.meta:
                reason = "the VGF partitioner did not claim it"
            if reason is None:
                self.paths.append(SamplerPath(node.name, IN_VGF))
                continue
            self.paths.append(SamplerPath(node.name, OWN_DELEGATE, reason))
            members = [node]
            members += [a for a in node.all_input_nodes if is_dequantize(a) and len(a.users) == 1]
            members += [u for u in node.users if is_quantize(u)]
            for member in members:
                member.meta.pop(_TAG, None)
        return PartitionResult(
            tagged_exported_program=program, partition_tags=dict(result.partition_tags)
        )


def _qparams(args: Any) -> QParams:
    if args.per_channel:
        raise UnsupportedOpError("per-channel quantization")
    return QParams(
        float(args.get_scale_per_tensor()),
        int(args.get_zp_per_tensor()),
        int(args.qmin),
        int(args.qmax),
        args.dtype,
    )


def _int_arg(value: object) -> int:
    if not isinstance(value, int):  # bool is an int
        raise UnsupportedOpError(f"expected a constant int argument, got {value!r}")
    return int(value)


def _fake(
    inputs: list[torch.Tensor],
    operator_name: str,
    domain_name: str,
    implementation_attrs: list[int],
) -> list[torch.Tensor]:
    """The CUSTOM op's output: N x Ho x Wo x C int8, from the NHWC image and the grid."""
    del operator_name, domain_name, implementation_attrs
    image, grid = inputs[0], inputs[1]
    shape = (image.shape[0], grid.shape[1], grid.shape[2], image.shape[3])
    return [torch.empty(shape, dtype=image.dtype, device=image.device)]


def _set_val(node: Node, value: Any) -> None:
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node.meta["val"] = value
    first = value[0] if isinstance(value, list) else value
    node.meta["tensor_meta"] = _extract_tensor_metadata(first)


def _is_compute(node: Node) -> bool:
    """A node model-converter makes a compute segment of: a Vulkan custom-shader ``CUSTOM`` op
    (etkit's or upstream's), or the ``getitem`` that reads its result."""
    if node.target is operator.getitem and isinstance(node.args[0], Node):
        node = node.args[0]
    return node.op == "call_function" and node.kwargs.get("domain_name") == DOMAIN


def schedule_segments(graph: torch.fx.Graph) -> bool:
    """Orders ``graph``'s nodes in waves, so that model-converter cuts the fewest segments and
    never an empty one: every graph op as early as its inputs allow, every compute op right
    after the graph ops it reads, and a graph op that reads a compute result only after every
    compute op of that wave. model-converter 0.11 numbers segments in op order and then moves
    an op whose only users lie in a later graph segment into that segment: with two samplers
    that do not read each other (two tensors warped by one flow), a graph op between them
    that only the output reads left its segment empty, and model-converter exits 255
    ("'spirv.ARM.Graph' op there should be at least one result"). Keeps the order of nodes
    within a wave (a topological order stays one). Returns whether anything moved."""
    levels: dict[Node, int] = {}
    for node in graph.nodes:
        compute = _is_compute(node)
        level = 1 if compute else 0
        for parent in node.all_input_nodes:
            above = levels.get(parent, 0)
            if _is_compute(parent) and not compute:
                above += 1  # a graph op after a compute op: the next graph wave
            elif compute and not _is_compute(parent) and above % 2 == 0:
                above += 1  # a compute op after a graph op: that wave's compute wave
            level = max(level, above)
        levels[node] = level
    if sum(1 for n in levels if _is_compute(n) and n.target is not operator.getitem) < 2:
        return False  # one compute segment: model-converter cuts at most three
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    ordered = sorted(nodes, key=lambda n: levels[n])  # stable: the old order within a wave
    if ordered == nodes:
        return False
    output = next(n for n in graph.nodes if n.op == "output")
    for node in ordered:
        output.prepend(node)
    return True


@cache
def _pass_classes() -> tuple[type, type]:
    """The rewrite pass, an ``ArmPass`` (built on first use: importing etkit_gridsampler must
    not import the Arm backend)."""
    arm = _arm.interfaces()
    if not arm["has_fake_tosa_impl"](OPERATOR_NAME):
        arm["register_fake_tosa"](OPERATOR_NAME)(_fake)
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.export.graph_signature import InputKind

    create_node = arm["create_node"]
    base: Any = arm["ArmPass"]

    class RewriteEtkitGridSamplerPass(base):  # type: ignore[misc]
        """Each quantized ``grid_sampler_2d`` (image int8, grid int16/int8, output int8, after
        Arm's Q/DQ folding) -> permute to NHWC -> ``tosa.CUSTOM`` (etkit's shader) -> permute
        back. A sampler outside etkit's contract here is an error, never left to upstream's
        passes (the partitioner gave those to etkit's delegate)."""

        _passes_required_after: ClassVar[set[type]] = set()

        def __init__(
            self,
            params_mode: ParamsMode,
            record: list[dict[str, Any]],
            pending: dict[str, list[int]],
        ) -> None:
            super().__init__()
            self.exported_program: ExportedProgram | None = None
            self.params_mode = params_mode
            self.record = record
            self.pending = pending

        def _op(self, node: Node) -> GridSampleOp:
            inputs, outputs = arm["get_input_qparams"](node), arm["get_output_qparams"](node)
            mode, padding, align_corners = (_int_arg(a) for a in node.args[2:5])
            return GridSampleOp(
                mode=MODE_NAMES[mode],
                padding_mode=PADDING_NAMES[padding],
                align_corners=bool(align_corners),
                image=_qparams(inputs[0]),
                grid=_qparams(inputs[1]),
                output=_qparams(next(iter(outputs.values()))),
            )

        def _own_copy(
            self,
            graph: torch.fx.Graph,
            operand: Node,
            source: Node,
            sampler: Node,
            other: Node | None = None,
        ) -> Node:
            """``operand`` itself, or an identity ``RESCALE`` of it (scale 1, zero points 0:
            the same integers) computed in the graph segment before the compute segment, when
            the compute segment could not read ``source`` directly: a VGF input that other ops
            of the VGF also read, or that the other operand is too (model-converter 0.11 gives
            such a compute segment an input resource the VGF never declares, or exits 255),
            or a value that is also a VGF output."""
            chain = _layout_chain(source)
            if chain[-1].op == "placeholder":
                own = {*chain, sampler, operand}
                shared = any(set(n.users) - own for n in chain) or (
                    other is not None and _layout_chain(other)[-1].op == "placeholder"
                )
            else:
                shared = any(u.op == "output" for n in chain for u in n.users)
            if not shared:
                return operand
            value = operand.meta["val"]
            copy: Node = create_node(
                graph, exir_ops.backend.tosa.RESCALE.default,
                args=(operand, value.dtype, [1.0], 0, 0), from_node=operand,
            )  # fmt: skip
            _set_val(copy, value.clone())
            return copy

        def _params_placeholder(self, graph: torch.fx.Graph, name: str, words: Any) -> Node:
            if self.exported_program is None:
                raise RuntimeError("the etkit grid-sampler rewrite needs its ExportedProgram")
            signature = self.exported_program.graph_signature
            users = {s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT}
            first = next(n for n in graph.nodes if n.op == "placeholder" and n.name in users)
            with graph.inserting_before(first):
                node: Node = arm["create_constant_placeholder"](
                    self.exported_program,
                    graph,
                    name,
                    InputKind.CONSTANT_TENSOR,
                    torch.tensor(words, dtype=torch.int32),
                )
            return node

        def call(self, graph_module: torch.fx.GraphModule) -> Any:
            graph = graph_module.graph
            modified = False
            for node in list(graph.nodes):
                if node.op != "call_function" or node.target != (
                    exir_ops.edge.aten.grid_sampler_2d.default
                ):
                    continue
                image, grid = node.args[0], node.args[1]
                assert isinstance(image, Node) and isinstance(grid, Node)
                n, c, h, w = (int(v) for v in image.meta["val"].shape)
                try:
                    op = self._op(node)
                    assert op.grid is not None
                    channels = padded_channels((n, c, h, w), grid.meta["val"].shape, op.grid.dtype)
                    if channels is None:
                        raise ValueError(
                            byte_size_reason((n, c, h, w), grid.meta["val"].shape, op.grid.dtype)
                        )
                    segment = build_segment(
                        op,
                        (n, channels, h, w),
                        tuple(grid.meta["val"].shape),
                        params_mode=self.params_mode,
                    )
                except (ValueError, KeyError, StopIteration) as error:
                    raise PayloadError(
                        f"grid sampler {node.name} reached the VGF but cannot be etkit's "
                        f"compute segment ({error}); export with sampler_delegate=True "
                        "(--sampler-delegate)"
                    ) from error
                modified = True
                with graph.inserting_before(node):
                    nhwc = create_node(
                        graph, exir_ops.edge.aten.permute_copy.default, args=(image, _NHWC),
                        from_node=image,
                    )  # fmt: skip
                    _set_val(
                        nhwc, exir_ops.edge.aten.permute_copy.default(image.meta["val"], _NHWC)
                    )
                    if channels == c:
                        inputs = [
                            self._own_copy(graph, nhwc, image, node, other=grid),
                            self._own_copy(graph, grid, grid, node, other=image),
                        ]
                    else:  # the graph segment pads the channels: the segment reads its own
                        pad = [0, channels - c]
                        padded: Node = create_node(
                            graph, exir_ops.edge.aten.constant_pad_nd.default,
                            args=(nhwc, pad, 0.0), from_node=node, inherit_qparams=True,
                        )  # fmt: skip
                        _set_val(
                            padded,
                            exir_ops.edge.aten.constant_pad_nd.default(nhwc.meta["val"], pad, 0.0),
                        )
                        inputs = [padded, self._own_copy(graph, grid, grid, node)]
                    if segment.params_mode == "tensor":
                        name = f"{node.name}_etkit_params"
                        inputs.append(self._params_placeholder(graph, name, segment.params_words))
                    # The payload (tens of thousands of ints: the SPIR-V) joins the node only
                    # after the last pass: every pass between would print and re-trace it.
                    key = f"etkit-segment-{id(self.pending)}-{len(self.pending)}"
                    self.pending[key] = segment.implementation_attrs()
                    attrs = list(json.dumps({_PENDING_KEY: key}).encode("utf-8"))
                    custom = create_node(
                        graph,
                        exir_ops.backend.tosa.CUSTOM.default,
                        args=(inputs,),
                        kwargs={
                            "operator_name": OPERATOR_NAME,
                            "domain_name": DOMAIN,
                            "implementation_attrs": attrs,
                        },
                        from_node=node,
                        inherit_qparams=True,
                    )
                    out = _fake([i.meta["val"] for i in inputs], OPERATOR_NAME, DOMAIN, attrs)[0]
                    _set_val(custom, [out])
                with graph.inserting_after(custom):
                    item = graph.create_node("call_function", operator.getitem, (custom, 0))
                    item.meta = dict(node.meta)
                    _set_val(item, out)
                kept: Node = item
                if channels != c:  # the padded channels' samples go
                    with graph.inserting_after(item):
                        kept = create_node(
                            graph, exir_ops.edge.aten.slice_copy.Tensor, args=(item, 3, 0, c),
                            from_node=node,
                        )  # fmt: skip
                        out = exir_ops.edge.aten.slice_copy.Tensor(out, 3, 0, c)
                        _set_val(kept, out)
                with graph.inserting_after(kept):
                    back = create_node(
                        graph, exir_ops.edge.aten.permute_copy.default, args=(kept, _NCHW),
                        from_node=node,
                    )  # fmt: skip
                    back.meta = dict(node.meta)
                    _set_val(back, exir_ops.edge.aten.permute_copy.default(out, _NCHW))
                node.replace_all_uses_with(back)
                graph.erase_node(node)
                self.record.append(
                    {
                        "node": node.name,
                        "op": op,
                        "image_shape": tuple(image.meta["val"].shape),
                        "grid_shape": tuple(grid.meta["val"].shape),
                        "params_mode": segment.params_mode,
                        "workgroups": segment.payload["workgroup_sizes"],
                        **({"channels_padded_to": channels} if channels != c else {}),
                    }
                )
            if modified:
                graph.eliminate_dead_code()
                graph.lint()
                graph_module.recompile()
                graph_module = super().call(graph_module).graph_module
            from torch.fx.passes.infra.pass_base import PassResult

            return PassResult(graph_module, modified)

    class FinalizeEtkitSegmentsPass(base):  # type: ignore[misc]
        """After the Arm pipeline's last pass: each etkit CUSTOM op gets its full payload."""

        _passes_required_after: ClassVar[set[type]] = set()

        def __init__(self, pending: dict[str, list[int]]) -> None:
            super().__init__()
            self.pending = pending

        def call(self, graph_module: torch.fx.GraphModule) -> Any:
            from torch.fx.passes.infra.pass_base import PassResult

            modified = False
            for node in graph_module.graph.nodes:
                if node.target != exir_ops.backend.tosa.CUSTOM.default:
                    continue
                if node.kwargs.get("operator_name") != OPERATOR_NAME:
                    continue
                marker = json.loads(bytes(node.kwargs["implementation_attrs"]).decode("utf-8"))
                key = marker.get(_PENDING_KEY) if isinstance(marker, dict) else None
                if key is None:
                    continue
                if key not in self.pending:
                    raise PayloadError(f"etkit compute segment {key} lost its payload")
                node.kwargs = {**node.kwargs, "implementation_attrs": self.pending[key]}
                modified = True
            if modified and schedule_segments(graph_module.graph):
                graph_module.graph.lint()
                graph_module.recompile()
            return PassResult(graph_module, modified)

    return RewriteEtkitGridSamplerPass, FinalizeEtkitSegmentsPass


@contextlib.contextmanager
def sampler_lowering(params_mode: ParamsMode | None = None) -> Iterator[list[dict[str, Any]]]:
    """While active, every VGF (TOSA) lowering turns the grid samplers that reach it into
    compute segments carrying etkit's shader: the rewrite pass runs before the Arm backend's
    own grid-sampler passes (registered through its pass-insertion registry, the route the VGF
    backend itself takes). ``params_mode``: how each call's parameter block travels
    (``payload.DEFAULT_PARAMS_MODE`` when ``None``). Yields the list each rewritten sampler is
    recorded in."""
    if params_mode is None:
        params_mode = payload.DEFAULT_PARAMS_MODE
    if params_mode not in PARAMS_MODES:
        raise ValueError(f"params_mode must be one of {PARAMS_MODES}, got {params_mode!r}")
    arm = _arm.interfaces()
    record: list[dict[str, Any]] = []
    pending: dict[str, list[int]] = {}
    rewrite_class, finalize_class = _pass_classes()
    rewrite, finalize = rewrite_class(params_mode, record, pending), finalize_class(pending)
    before, after = arm["InsertRescaleInt32Pass"], arm["EnsureUniqueOutputNodesPass"]
    registry = arm["registered_pass_insertions"]
    arm["register_pass_insertions_before"](before, [rewrite])
    arm["register_pass_insertions_after"](after, [finalize])
    try:
        yield record
    finally:
        for target, inserted in ((before, rewrite), (after, finalize)):
            insertions = registry.get(target)
            for kept in (insertions.before_passes, insertions.after_passes) if insertions else ():
                if inserted in kept:
                    kept.remove(inserted)
