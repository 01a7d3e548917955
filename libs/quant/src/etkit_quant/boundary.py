"""``BoundaryQuantizer``: per-input, per-output and per-grid-sampler quantization on top of any
PT2E quantizer, through the public ``Quantizer`` protocol only."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, Literal, get_args

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

from etkit_quant.gather_positions import gather_position_nodes
from etkit_quant.graph import (
    attribute,
    coordinate_inputs,
    coordinate_nodes,
    is_grid_sampler,
    is_shape_op,
    operator_name,
)
from etkit_quant.integer_operands import integer_scalar_operands
from etkit_quant.qspecs import (
    fixed_qparams,
    is_fixed,
    observed_int8,
    observed_int16,
    snorm8,
    snorm16,
)
from etkit_quant.requantize import SHARED_PARAMETER_OPS

logger = logging.getLogger(__name__)

ANNOTATION_KEY: Final = "quantization_annotation"
# What the Arm backend's lowering reads to decide that a node is quantized
# (executorch.backends.arm.common.annotation_meta.ArmAnnotationInfo.CUSTOM_META_KEY).
ARM_ANNOTATION_INFO_KEY: Final = "_arm_annotation_info"
FLOAT_REASON_KEY: Final = "etkit_float_reason"
"""The ``node.meta["custom"]`` key under which ``BoundaryQuantizer`` records why it left an op in
float (``COORDINATE_ARITHMETIC`` or ``USER_CHOICE``); torch.export and ExecuTorch's lowering
carry ``custom`` metadata to the nodes made from it, so a report of the lowered program can
say why each float op is float."""
COORDINATE_ARITHMETIC: Final = "coordinate arithmetic"
USER_CHOICE: Final = "user choice"
_DEFAULT: Any = object()
GridMath = Literal["float", "int"]
GRID_MATHS: Final = get_args(GridMath)


def _check_qspec(qspec: object, what: str, boundary: bool) -> QuantizationSpec | None:
    if qspec is None:
        return None
    if not isinstance(qspec, QuantizationSpec):
        raise TypeError(
            f"{what} must be a torchao QuantizationSpec or None (use etkit_quant.snorm8() and the "
            f"other presets), got {type(qspec).__name__}"
        )
    if boundary and qspec.is_dynamic:
        raise ValueError(
            f"{what} is dynamic (is_dynamic=True); a graph boundary needs static parameters an "
            "engine can know in advance"
        )
    return qspec


def user_inputs(model: GraphModule) -> list[Node]:
    """The graph's user inputs, in order: what ``input_qspecs`` index. An input nothing reads
    (a model's argument it ignores, or one whose only readers a normalization removed) keeps
    its place and is left unannotated."""
    return [n for n in model.graph.nodes if n.op == "placeholder"]


def user_outputs(model: GraphModule) -> list[Node]:
    """The nodes producing the graph's outputs, in order: what ``output_qspecs`` index."""
    output = next(n for n in model.graph.nodes if n.op == "output")
    produced: list[Node] = []
    torch.fx.node.map_arg(output.args[0], produced.append)
    return produced


class BoundaryQuantizer(Quantizer):  # type: ignore[misc]  # torchao is untyped
    """A PT2E ``Quantizer`` that runs ``base`` and then:

    - gives user input ``k`` ``input_qspecs[k]`` (one nothing reads is left alone) and the
      producer of graph output ``k`` ``output_qspecs[k]`` (``None``: that input or output stays
      float); the consumers of those tensors share the boundary's parameters;
    - gives every grid sampler its image, grid and output qspecs (``None``: float); with
      ``grid_sampler_image_from_producer``, a sampler whose image is already quantized to int8
      per tensor (a boundary's qspec, or the base's for the op that computes it) reads it with
      those parameters instead, so no requantization runs before the sampler (on VGF one before
      a sampler whose image is a graph input runs on the CPU, outside every delegate); the
      image qspec then applies only to images that arrive in float;
    - with ``grid_math="float"`` (the default), removes the base's annotation from the
      coordinate arithmetic (``graph.coordinate_nodes``: the elementwise and shape ops, base
      grids and ``affine_grid`` between the last compute-heavy op and a grid sampler's grid
      input; and the positions and weights of index gathers, ``gather_positions``), so grid
      positions are computed in float and quantized once, at the grid sampler;
      the layers that predict the flow or theta stay the base's, and each tensor entering the
      coordinate arithmetic (``graph.coordinate_inputs``) is quantized with
      ``coordinate_input_qspec`` (default ``observed_int8()``: calibrated, covering every
      value, never clipping a flow's extremes as a histogram observer may);
      ``grid_math="int"`` leaves the base's annotations there too (the coordinate arithmetic
      runs on integers where the base quantizes it);
    - keeps the Arm backend's annotation record (``node.meta["custom"]``) in step with every
      annotation it changes.

    Raises ``TypeError`` for a ``base`` that is not a ``Quantizer`` or a qspec that is not a
    ``QuantizationSpec``, ``ValueError`` for a dynamic qspec at a boundary, and, when annotating,
    ``ValueError`` naming both counts when a qspec sequence's length differs from the graph's
    number of user inputs or outputs.
    """

    def __init__(
        self,
        base: Quantizer,
        *,
        input_qspecs: Sequence[QuantizationSpec | None],
        output_qspecs: Sequence[QuantizationSpec | None],
        grid_sampler_image_qspec: QuantizationSpec | None = _DEFAULT,
        grid_sampler_grid_qspec: QuantizationSpec | None = _DEFAULT,
        grid_sampler_output_qspec: QuantizationSpec | None = _DEFAULT,
        grid_math: GridMath = "float",
        coordinate_input_qspec: QuantizationSpec | None = _DEFAULT,
        grid_sampler_image_from_producer: bool = False,
    ) -> None:
        super().__init__()
        if grid_math not in GRID_MATHS:
            raise ValueError(
                f"grid_math must be one of {', '.join(map(repr, GRID_MATHS))}, got {grid_math!r}"
            )
        if not isinstance(base, Quantizer):
            raise TypeError(
                f"base must be a torchao PT2E Quantizer (VgfQuantizer, XNNPACKQuantizer, ...), "
                f"got {type(base).__name__}"
            )
        for name, value in (("input_qspecs", input_qspecs), ("output_qspecs", output_qspecs)):
            if isinstance(value, QuantizationSpecBase) or not isinstance(value, Sequence):
                raise TypeError(f"{name} must be a sequence of qspecs (one per {name[:-7]}put)")
        self.base = base
        self._arm_base = type(base).__module__.startswith("executorch.backends.arm")
        self.input_qspecs = tuple(
            self._computed(_check_qspec(q, f"input_qspecs[{k}]", True))
            for k, q in enumerate(input_qspecs)
        )
        self.output_qspecs = tuple(
            self._computed(_check_qspec(q, f"output_qspecs[{k}]", True))
            for k, q in enumerate(output_qspecs)
        )
        self.grid_sampler_image_qspec = self._computed(
            _check_qspec(
                snorm8() if grid_sampler_image_qspec is _DEFAULT else grid_sampler_image_qspec,
                "grid_sampler_image_qspec",
                False,
            )
        )
        self.grid_sampler_grid_qspec = _check_qspec(
            snorm16() if grid_sampler_grid_qspec is _DEFAULT else grid_sampler_grid_qspec,
            "grid_sampler_grid_qspec",
            False,
        )
        self.grid_sampler_output_qspec = self._computed(
            _check_qspec(
                snorm8() if grid_sampler_output_qspec is _DEFAULT else grid_sampler_output_qspec,
                "grid_sampler_output_qspec",
                False,
            )
        )
        self.grid_math: GridMath = grid_math
        self.coordinate_input_qspec = self._computed(
            _check_qspec(
                observed_int8() if coordinate_input_qspec is _DEFAULT else coordinate_input_qspec,
                "coordinate_input_qspec",
                False,
            )
        )
        self.coordinate_nodes: tuple[str, ...] = ()
        """After ``annotate``: the nodes of the coordinate arithmetic left in float."""
        self.coordinate_inputs: tuple[str, ...] = ()
        """After ``annotate``: the tensors entering it (quantized with
        ``coordinate_input_qspec`` where the base quantizes them)."""
        self.grid_sampler_image_from_producer = grid_sampler_image_from_producer
        self._annotations: dict[str, QuantizationAnnotation] = {}

    @property
    def arm_base(self) -> bool:
        """Whether the base is one of ExecuTorch's Arm quantizers (VGF, Ethos-U, TOSA): their
        lowering computes a bilinear resize on the integers in its output's parameters
        (``requantize.INTERPOLATING_OPS``) and clamps a rescale at the type's range
        (``narrow_ranges``)."""
        return self._arm_base

    def _computed(self, qspec: QuantizationSpec | None) -> QuantizationSpec | None:
        """``qspec`` as the base's backend computes it: XNNPACK clamps int8 at [-128, 127]
        whatever a qspec's ``quant_min`` says, so on a base that is not Arm's a calibrated
        ``observed_int8()`` becomes ``observed_int8(full_range=True)``; with [-127, 127] a value
        below the range came out -128 in the program and -127 in the quantized model (a
        clipped theta one step off, then whole pixels off after a nearest sampler; fuzz seed
        6032)."""
        if not self._arm_base and qspec == observed_int8():
            return observed_int8(full_range=True)
        return qspec

    # -- the Quantizer protocol -------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        # The base's passes may write into a parameter (Arm folds a constant scale after a
        # convolution into its weights in place), and an exported graph's parameters are the
        # caller's model's own tensors: the graph gets its own copies first.
        own_constants(model)
        integer_scalar_operands(model)  # before the base turns integer arithmetic float
        result: GraphModule = self.base.transform_for_annotation(model)
        return result

    def annotate(self, model: GraphModule) -> GraphModule:
        inputs, outputs = user_inputs(model), user_outputs(model)
        output = next(n for n in model.graph.nodes if n.op == "output")
        self.check_counts(len(inputs), len(outputs))
        model = _annotate_with(self.base, model)
        skipped = _skipped_parameter_users(model)
        if skipped:
            # The base quantizes an op whose parameter another op shares, and left that other op
            # float (XNNPACK's quantizer annotates only the first op reading a weight; XNNPACK
            # then cannot compile the float op beside the quantized one): each such op reads its
            # own copy of the parameters, and the base annotates it.
            _unshare_parameters(model, skipped)
            model = _annotate_with(self.base, model)
        floated: set[Node] = set()
        if self.grid_math == "float":
            region = coordinate_nodes(model) | gather_position_nodes(model)  # index gathers too
            for node in region:
                if ANNOTATION_KEY in node.meta:
                    logger.debug("coordinate arithmetic %s: base annotation removed", node.name)
                node.meta[ANNOTATION_KEY] = QuantizationAnnotation(_annotated=True)
                self._mark_arm(node, quantized=False)
                mark_float(node, COORDINATE_ARITHMETIC)
                floated.add(node)
            entering = coordinate_inputs(model, region)
            for node in entering:
                self._annotate_coordinate_input(node)
            order = {n: k for k, n in enumerate(model.graph.nodes)}
            self.coordinate_nodes = tuple(n.name for n in sorted(region, key=order.__getitem__))
            self.coordinate_inputs = tuple(n.name for n in entering)
        for node in model.graph.nodes:
            if is_grid_sampler(node):
                self._annotate_grid_sampler(node)
        for node, qspec in zip(inputs, self.input_qspecs, strict=True):
            if node.users:  # (an input nothing reads has nothing to quantize)
                self._annotate_boundary(node, qspec, f"input {node.name}")
        seen: dict[Node, QuantizationSpec | None] = {}
        for k, (node, qspec) in enumerate(zip(outputs, self.output_qspecs, strict=True)):
            if node in seen and seen[node] != qspec:
                raise ValueError(
                    f"output {k} is the same tensor ({node.name}) as an earlier output but asks "
                    "for different quantization; give both the same qspec"
                )
            seen[node] = qspec
            output_annotation = output.meta.get(ANNOTATION_KEY)
            computed = _output_qspec(node)
            if (
                not self._arm_base
                and qspec is not None
                and isinstance(computed, QuantizationSpec)
                and computed.dtype != qspec.dtype
            ):
                # The op computes in another integer type than the boundary's (an int8 base, a
                # uint8 output): it keeps its own parameters and the output is requantized.
                # (XNNPACK computes an int8 op's uint8 output wrongly; Arm's lowering rescales
                # an op's result to the boundary's type itself, and a separate requantize
                # would leave a uint8 tensor to transpose at a channels-last output.)
                if output_annotation is None:
                    output_annotation = QuantizationAnnotation(_annotated=True)
                    output.meta[ANNOTATION_KEY] = output_annotation
                output_annotation.input_qspec_map[node] = qspec
                logger.debug("output %d: requantized from %s to %s", k, computed.dtype, qspec.dtype)
                continue
            if node.name in self.coordinate_nodes and qspec is not None:
                # A grid the program returns, computed by the coordinate arithmetic: it stays
                # float and is quantized on its way out, as a grid is at a sampler's grid input
                # (quantizing the op's own result made it an integer op, which Arm's lowering
                # decomposes with float constants against integer inputs).
                if output_annotation is None:
                    output_annotation = QuantizationAnnotation(_annotated=True)
                    output.meta[ANNOTATION_KEY] = output_annotation
                output_annotation.input_qspec_map[node] = qspec
                logger.debug("output %d: coordinate arithmetic, quantized at the output", k)
                continue
            if self._annotate_boundary(node, qspec, f"output {k}"):
                mark_float(node, USER_CHOICE)
                floated.add(node)
            # Some bases (Arm) also annotate the output node's inputs: the boundary decides.
            if output_annotation is not None and node in output_annotation.input_qspec_map:
                output_annotation.input_qspec_map[node] = qspec
        _settle_tied_inputs(model)
        if self.grid_sampler_image_from_producer:
            for node in model.graph.nodes:
                if is_grid_sampler(node):
                    _read_image_as_produced(node)
        # An op etkit turned float must not share a parameter with a quantized op: XNNPACK
        # serializes a shared bias once, for the first op that reads it.
        _unshare_parameters(model, {n for n in floated if _shares_parameters(n, floated)})
        return model

    def validate(self, model: GraphModule) -> None:
        self.base.validate(model)
        for node in model.graph.nodes:
            if is_grid_sampler(node) and node.meta.get(ANNOTATION_KEY) is not self._annotations.get(
                node.name
            ):
                raise ValueError(f"grid sampler {node.name} lost its etkit annotation")

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: Any
    ) -> None:
        self.base.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)

    # -- helpers ------------------------------------------------------------------------------

    def check_counts(self, num_inputs: int, num_outputs: int) -> None:
        """Raises ``ValueError`` naming both counts when the qspec sequences do not fit a graph
        with ``num_inputs`` user inputs and ``num_outputs`` outputs."""
        if len(self.input_qspecs) != num_inputs:
            raise ValueError(
                f"input_qspecs has {len(self.input_qspecs)} entries but the model has "
                f"{num_inputs} user inputs; give one qspec (or None) per input"
            )
        if len(self.output_qspecs) != num_outputs:
            raise ValueError(
                f"output_qspecs has {len(self.output_qspecs)} entries but the model has "
                f"{num_outputs} outputs; give one qspec (or None) per output"
            )

    def _mark_arm(self, node: Node, quantized: bool) -> None:
        if not self._arm_base or node.op != "call_function":
            return
        custom = node.meta.get("custom", {})
        custom[ARM_ANNOTATION_INFO_KEY] = {"quantized": quantized}
        node.meta["custom"] = custom

    def _annotate_grid_sampler(self, node: Node) -> None:
        image, grid = node.args[0], node.args[1]
        assert isinstance(image, Node) and isinstance(grid, Node)
        input_map: dict[Node, QuantizationSpecBase | None] = {grid: self.grid_sampler_grid_qspec}
        if image is not grid:
            input_map[image] = self.grid_sampler_image_qspec
        annotation = QuantizationAnnotation(
            input_qspec_map=input_map, output_qspec=self.grid_sampler_output_qspec, _annotated=True
        )
        node.meta[ANNOTATION_KEY] = annotation
        self._annotations[node.name] = annotation
        quantized = any(
            q is not None
            for q in (
                self.grid_sampler_image_qspec,
                self.grid_sampler_grid_qspec,
                self.grid_sampler_output_qspec,
            )
        )
        self._mark_arm(node, quantized)
        if not quantized:
            mark_float(node, USER_CHOICE)
        if self.grid_sampler_output_qspec is not None:
            self._share_with_consumers(node, self.grid_sampler_output_qspec)

    def _annotate_coordinate_input(self, node: Node) -> None:
        """A tensor entering the coordinate arithmetic (a predicted flow or theta) that the base
        quantizes with calibrated parameters of its own takes ``coordinate_input_qspec``, and
        its quantized consumers read it so (one observer). Graph inputs are the boundary's,
        parameters shared with the op's inputs (a reshape's) and fixed ones (a sigmoid's
        exact range) stay the base's."""
        qspec = self.coordinate_input_qspec
        annotation = node.meta.get(ANNOTATION_KEY)
        if qspec is None or node.op != "call_function" or annotation is None:
            return
        base = annotation.output_qspec
        if not isinstance(base, QuantizationSpec) or is_fixed(base):
            return
        annotation.output_qspec = qspec
        logger.debug("coordinate input %s: %s", node.name, qspec)
        self._share_with_consumers(node, qspec)

    def _annotate_boundary(self, node: Node, qspec: QuantizationSpec | None, what: str) -> bool:
        """Gives ``node``'s output ``qspec``; returns whether that made an op compute in
        float."""
        annotation = node.meta.get(ANNOTATION_KEY)
        base_output = None if annotation is None else annotation.output_qspec
        base_quantized = annotation is not None and (
            base_output is not None
            or any(q is not None for q in annotation.input_qspec_map.values())
        )
        if annotation is None:
            annotation = QuantizationAnnotation(_annotated=True)
            node.meta[ANNOTATION_KEY] = annotation
        annotation.output_qspec = qspec
        annotation._annotated = True
        if qspec is None:
            logger.debug("%s stays float", what)
            if node.op != "call_function" or is_grid_sampler(node) or not base_quantized:
                return False
            # A float output comes from an op that computes in float: an op with integer
            # inputs and a float output is what no integer backend lowers (Arm: "No output
            # quantization parameter found"; add/sub: mismatched dtypes).
            annotation.input_qspec_map = {}
            self._mark_arm(node, quantized=False)
            self._unfuse_producers(node, base_output)
            return True
        self._mark_arm(node, quantized=True)
        self._share_with_consumers(node, qspec)
        if node.op == "call_function" and (
            isinstance(base_output, SharedQuantizationSpec)
            or (not base_quantized and _moves_values(node))
        ):
            # (an op the base left float that computes new values, a sigmoid on XNNPACK, keeps
            # its input's own parameters: the boundary's would clip its input to its output's
            # range, the logits of a sigmoid to [-1, 1])
            self._share_with_inputs(node, qspec)
        return False

    def _unfuse_producers(self, node: Node, base_output: QuantizationSpecBase | None) -> None:
        """``node`` now computes in float; an op the base fused with it (a conv before its ReLU:
        quantized inputs, no output qspec of its own, ``node`` quantizing for both) would be
        left with integer inputs and no output parameters, which the Arm lowering refuses ("No
        output quantization parameter found"). It quantizes its own output with the qspec the
        base gave ``node`` (an observer: it observes the op's own range), so the op stays
        integer and only ``node`` runs in float; without such a qspec it computes in float too."""
        for source in node.all_input_nodes:
            annotation = source.meta.get(ANNOTATION_KEY)
            if source.op != "call_function" or annotation is None:
                continue
            if annotation.output_qspec is not None or not any(
                q is not None for q in annotation.input_qspec_map.values()
            ):
                continue
            if isinstance(base_output, QuantizationSpec) and not is_fixed(base_output):
                annotation.output_qspec = base_output
                logger.debug("%s quantizes its own output: %s is float", source.name, node.name)
                continue
            annotation.input_qspec_map = {}
            self._mark_arm(source, quantized=False)
            mark_float(source, USER_CHOICE)
            self._unfuse_producers(source, None)

    def _share_with_consumers(self, node: Node, qspec: QuantizationSpec) -> None:
        """Consumers that quantize ``node``'s output read it with ``qspec``, so that PT2E's
        prepare shares one observer (the qspecs are equal) instead of requantizing on each edge.
        Grid samplers keep their own input qspecs, and so do inputs the base tied to other
        inputs of their op (concatenation: one scale for all; see ``_settle_tied_inputs``). A
        consumer the base left unannotated that only moves values (``is_shape_op``: view,
        permute, ...) passes ``qspec`` on, as the base does after the ops it annotated itself
        (XNNPACK annotates them only there, before etkit's annotations exist, and cannot run
        one between a dequantize and a quantize of different parameters)."""
        for user in node.users:
            annotation = user.meta.get(ANNOTATION_KEY)
            if is_grid_sampler(user):
                continue
            if (annotation is None or not annotation._annotated) and (
                is_shape_op(user) and user.args[0] is node
            ):
                user.meta[ANNOTATION_KEY] = QuantizationAnnotation(
                    input_qspec_map={node: qspec},
                    output_qspec=SharedQuantizationSpec((node, user)),
                    _annotated=True,
                )
                self._mark_arm(user, quantized=True)
                self._share_with_consumers(user, qspec)
                continue
            if annotation is None:
                continue
            base = annotation.input_qspec_map.get(node)
            if base is None or _tied_inputs(user, annotation).get((node, user)):
                continue
            if isinstance(base, QuantizationSpec) and base.dtype != qspec.dtype:
                continue  # the op computes in another integer type: it requantizes
            annotation.input_qspec_map[node] = qspec

    def _share_with_inputs(self, node: Node, qspec: QuantizationSpec) -> None:
        """``node``'s output shares its input's parameters (the base said so with a
        ``SharedQuantizationSpec``, as Arm does for clamp, relu, pooling and reshapes, or left the
        op float): its float inputs take the boundary's parameters too, and so, back through
        such ops, does a producer that feeds only this chain. The backend then sees one scale
        on both sides of each op, as its integer lowering of such ops needs."""
        annotation = node.meta[ANNOTATION_KEY]
        for source in node.all_input_nodes:
            if not _is_float_activation(source):
                continue
            annotation.input_qspec_map[source] = qspec
            source_annotation = source.meta.get(ANNOTATION_KEY)
            if len(source.users) != 1 or source_annotation is None:
                continue
            shared = isinstance(source_annotation.output_qspec, SharedQuantizationSpec)
            if shared and source.op == "call_function":
                # It keeps sharing its input's parameters (an equal qspec on its output would
                # be an observer of its own: Arm lowers an int8 bilinear resize, a pool, a clamp
                # as if input and output parameters were one, and was 1-3 steps off otherwise);
                # its inputs take the boundary's.
                self._share_with_inputs(source, qspec)
            elif isinstance(source_annotation.output_qspec, QuantizationSpec):
                source_annotation.output_qspec = qspec


def mark_float(node: Node, reason: str) -> None:
    """Records in ``node.meta["custom"]`` (``FLOAT_REASON_KEY``) why ``node`` computes in
    float."""
    if node.op != "call_function":
        return
    custom = node.meta.get("custom", {})
    custom[FLOAT_REASON_KEY] = reason
    node.meta["custom"] = custom


def float_reason(node: Node) -> str | None:
    """Why ``BoundaryQuantizer`` left ``node`` (or the node it was made from) in float, as
    ``mark_float`` recorded it; ``None`` when it did not."""
    custom = node.meta.get("custom")
    reason = custom.get(FLOAT_REASON_KEY) if isinstance(custom, dict) else None
    return reason if isinstance(reason, str) else None


def _moves_values(node: Node) -> bool:
    """Whether ``node``'s integer result is its integer input moved, selected, ordered or
    clamped (``is_shape_op``, ``requantize.SHARED_PARAMETER_OPS``): an op whose input can take
    its output's parameters."""
    name = operator_name(node.target).split(".")[0].removesuffix("_copy")
    return is_shape_op(node) or name in SHARED_PARAMETER_OPS


def _is_float_activation(node: Node) -> bool:
    value = node.meta.get("val")
    return (
        node.op in ("call_function", "placeholder")
        and isinstance(value, torch.Tensor)
        and value.dtype.is_floating_point
    )


Edge = tuple[Node, Node]


def _tied_inputs(node: Node, annotation: QuantizationAnnotation) -> dict[Edge, list[Node]]:
    """The input edges of ``node`` that the base tied together (an input whose qspec is a
    ``SharedQuantizationSpec`` of another input edge of ``node``, as Arm and XNNPACK annotate
    ``cat``), each mapped to the inputs of its group, the one the others share with first."""
    groups: dict[Node, list[Node]] = {}
    for source, qspec in annotation.input_qspec_map.items():
        if not isinstance(qspec, SharedQuantizationSpec):
            continue
        target = qspec.edge_or_node
        if isinstance(target, tuple) and target[1] is node and target[0] is not source:
            groups.setdefault(target[0], [target[0]]).append(source)
    return {(member, node): members for members in groups.values() for member in members}


def _output_qspec(node: Node, depth: int = 0) -> QuantizationSpecBase | None:
    """The qspec ``node``'s output is quantized with, through ``SharedQuantizationSpec``s."""
    annotation = node.meta.get(ANNOTATION_KEY)
    qspec = None if annotation is None else annotation.output_qspec
    while isinstance(qspec, SharedQuantizationSpec) and depth < 32:
        depth += 1
        target = qspec.edge_or_node
        if isinstance(target, Node):
            return _output_qspec(target, depth)
        source, consumer = target
        consumer_annotation = consumer.meta.get(ANNOTATION_KEY)
        qspec = (
            None if consumer_annotation is None else consumer_annotation.input_qspec_map.get(source)
        )
    return qspec


def _is_int8_per_tensor(qspec: QuantizationSpecBase | None) -> bool:
    return (
        isinstance(qspec, QuantizationSpec)
        and qspec.dtype == torch.int8
        and qspec.qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric)
    )


def _read_image_as_produced(sampler: Node) -> None:
    """Grid sampler ``sampler`` reads its image with the parameters the image's producer
    quantizes it with, when that is int8 per tensor (what the integer kernel reads), instead of
    requantizing it first; its own image qspec stays for an image that arrives in float."""
    image, grid = sampler.args[0], sampler.args[1]
    annotation = sampler.meta.get(ANNOTATION_KEY)
    if not isinstance(image, Node) or image is grid or annotation is None:
        return
    if annotation.input_qspec_map.get(image) is None:
        return  # a float sampler stays float
    produced = _output_qspec(image)
    if not _is_int8_per_tensor(produced):
        return
    logger.debug("grid sampler %s reads image %s as produced", sampler.name, image.name)
    annotation.input_qspec_map[image] = SharedQuantizationSpec(image)


_OBSERVED: Final = {torch.int8: observed_int8, torch.int16: observed_int16}


def _fixed_range(qspec: object) -> tuple[float, int, int, int, torch.dtype] | None:
    """The parameters of a fixed-parameter qspec (etkit's presets or torchao's
    ``FixedQParamsQuantizationSpec``, as Arm gives a grid sampler's output); ``None`` for any
    other."""
    if isinstance(qspec, FixedQParamsQuantizationSpec):
        return (qspec.scale, qspec.zero_point, qspec.quant_min, qspec.quant_max, qspec.dtype)
    if isinstance(qspec, QuantizationSpec) and is_fixed(qspec):
        p = fixed_qparams(qspec)
        return (p.scale, p.zero_point, p.quant_min, p.quant_max, p.dtype)
    return None


def _settle_tied_inputs(model: GraphModule) -> None:
    """Inputs the base tied together (one scale for all inputs of a ``cat``) keep the base's
    observed parameters, so every input is requantized into one range covering them all; but
    when every tied input comes from an etkit boundary or grid sampler with the same fixed
    qspec, the group takes that qspec and reads them as they are. A group the base tied to a
    fixed range its first input no longer produces (Arm gives a grid sampler's output SNORM8,
    [-1, 1], and ties a ``cat`` of it to that range; etkit then gives the sampler a calibrated
    output) takes observed parameters instead, covering every tied input, as the base does
    for any other group: the stale range would clip each input reaching past it."""
    for node in model.graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if annotation is None:
            continue
        groups = {id(m): m for m in _tied_inputs(node, annotation).values()}
        for members in groups.values():
            qspecs = [_output_qspec(m) for m in members]
            if is_fixed(qspecs[0]) and all(q == qspecs[0] for q in qspecs):
                annotation.input_qspec_map[members[0]] = qspecs[0]
                continue
            root = annotation.input_qspec_map.get(members[0])
            stale = _fixed_range(root) not in (None, _fixed_range(qspecs[0]))
            if stale and root.dtype in _OBSERVED:
                observed = _OBSERVED[root.dtype]()
                logger.debug(
                    "%s: inputs %s tied to a fixed range %s does not produce; observed instead",
                    node.name,
                    ", ".join(m.name for m in members),
                    members[0].name,
                )
                annotation.input_qspec_map[members[0]] = observed


def own_constants(model: GraphModule) -> None:
    """Gives every tensor that ``model``'s graph reads through ``get_attr`` (parameters,
    buffers, constants) a copy of its own, in place, so that a pass writing into one leaves the
    module ``model`` was exported from as it was. A tensor read under several names stays one
    tensor (one copy)."""
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (original, copy)
    for node in model.graph.nodes:
        if node.op != "get_attr":
            continue
        assert isinstance(node.target, str)
        owner_path, _, name = node.target.rpartition(".")
        owner = model.get_submodule(owner_path)
        value = getattr(owner, name, None)
        if not isinstance(value, torch.Tensor):
            continue
        if id(value) in copies:
            copy = copies[id(value)][1]
        else:
            data = value.detach().clone()
            copy = (
                torch.nn.Parameter(data, value.requires_grad)
                if isinstance(value, torch.nn.Parameter)
                else data
            )
            copies[id(value)] = (value, copy)  # the original kept alive: its id stays its own
        if name in owner._parameters:
            owner._parameters[name] = copy  # type: ignore[assignment]
        elif name in owner._buffers:
            owner._buffers[name] = copy
        else:
            setattr(owner, name, copy)


def _parameters(node: Node) -> list[Node]:
    return [a for a in node.all_input_nodes if a.op == "get_attr"]


def _shares_parameters(node: Node, but: set[Node]) -> bool:
    """Whether ``node`` reads a parameter that an op not in ``but`` reads too."""
    return any(u not in but for p in _parameters(node) for u in p.users)


def _skipped_parameter_users(model: GraphModule) -> set[Node]:
    """Ops the base left unannotated that read a parameter another op quantizes."""
    skipped: set[Node] = set()
    for parameter in model.graph.nodes:
        if parameter.op != "get_attr" or len(parameter.users) < 2:
            continue
        quantized, unannotated = False, []
        for user in parameter.users:
            annotation = user.meta.get(ANNOTATION_KEY)
            if annotation is not None and annotation.input_qspec_map.get(parameter) is not None:
                quantized = True
            elif user.op == "call_function" and (annotation is None or not annotation._annotated):
                unannotated.append(user)
        if quantized:
            skipped.update(unannotated)
    return skipped


def _unshare_parameters(model: GraphModule, users: set[Node]) -> None:
    """Each of ``users`` reads its own copy of every parameter (``get_attr``) it shares with
    another op: a new attribute, so that a later ``torch.export`` keeps them apart too."""
    graph = model.graph
    for user in sorted(users, key=lambda n: n.name):
        for parameter in _parameters(user):
            if len(parameter.users) < 2:
                continue
            assert isinstance(parameter.target, str)
            value = attribute(model, parameter.target)
            name = _free_attr_name(model, parameter.target.replace(".", "_") + "_for_" + user.name)
            if isinstance(value, torch.nn.Parameter):
                model.register_parameter(name, torch.nn.Parameter(value.detach().clone(), False))
            elif isinstance(value, torch.Tensor):
                model.register_buffer(name, value.detach().clone())
            else:
                continue
            with graph.inserting_before(user):
                copy = graph.get_attr(name)
            copy.meta = {k: v for k, v in parameter.meta.items() if k != ANNOTATION_KEY}
            user.replace_input_with(parameter, copy)
            logger.debug("%s reads its own copy of %s (%s)", user.name, parameter.target, name)
    if users:
        model.recompile()


def _free_attr_name(model: GraphModule, base: str) -> str:
    name, k = base, 1
    while hasattr(model, name):
        name, k = f"{base}_{k}", k + 1
    return name


def _annotate_with(base: Quantizer, model: GraphModule) -> GraphModule:
    """``base.annotate(model)``, without XNNPACK's batch-norm patterns where no batch norm is.

    XNNPACK's quantizer matches its four convolution + batch-norm patterns on every call, also
    for post-training quantization, and builds each pattern with ``torch.export`` every time
    (12 exports, about 2 s of a small model's export; upstream: executorch 1.0
    ``xnnpack_quantizer_utils._do_annotate_conv_bn``). A pattern holding a batch norm cannot
    match a graph that has none, so those patterns are left out for that graph; the
    annotations are the same.
    """
    patterns = getattr(base, "SUPPORTED_PATTERNS", None)
    if patterns is None or any("batch_norm" in str(n.target) for n in model.graph.nodes):
        annotated: GraphModule = base.annotate(model)
        return annotated
    own = vars(base).get("SUPPORTED_PATTERNS")
    base.SUPPORTED_PATTERNS = [p for p in patterns if "_bn" not in p.name]
    try:
        result: GraphModule = base.annotate(model)
    finally:
        if own is None:
            del base.SUPPORTED_PATTERNS
        else:
            base.SUPPORTED_PATTERNS = own
    return result
