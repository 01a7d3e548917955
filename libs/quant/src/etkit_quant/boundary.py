"""``BoundaryQuantizer``: per-input, per-output and per-grid-sampler quantization on top of any
PT2E quantizer, through the public ``Quantizer`` protocol only."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

from etkit_quant.graph import grid_position_nodes, is_grid_sampler
from etkit_quant.qspecs import snorm8, snorm16

logger = logging.getLogger(__name__)

ANNOTATION_KEY: Final = "quantization_annotation"
# What the Arm backend's lowering reads to decide that a node is quantized
# (executorch.backends.arm.common.annotation_meta.ArmAnnotationInfo.CUSTOM_META_KEY).
ARM_ANNOTATION_INFO_KEY: Final = "_arm_annotation_info"
_DEFAULT: Any = object()


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
    """The graph's user inputs that have users, in order: what ``input_qspecs`` index."""
    return [n for n in model.graph.nodes if n.op == "placeholder" and n.users]


def user_outputs(model: GraphModule) -> list[Node]:
    """The nodes producing the graph's outputs, in order: what ``output_qspecs`` index."""
    output = next(n for n in model.graph.nodes if n.op == "output")
    produced: list[Node] = []
    torch.fx.node.map_arg(output.args[0], produced.append)
    return produced


class BoundaryQuantizer(Quantizer):  # type: ignore[misc]  # torchao is untyped
    """A PT2E ``Quantizer`` that runs ``base`` and then:

    - gives user input ``k`` (the k-th placeholder that has users) ``input_qspecs[k]`` and the
      producer of graph output ``k`` ``output_qspecs[k]`` (``None``: that input or output stays
      float); the consumers of those tensors share the boundary's parameters;
    - gives every grid sampler its image, grid and output qspecs (``None``: float);
    - with ``keep_grid_positions_float``, removes the base's annotation from the grid-position
      subgraph (see ``grid_position_nodes``), so grid positions are computed in float and
      quantized once, at the grid sampler;
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
        keep_grid_positions_float: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(base, Quantizer):
            raise TypeError(
                f"base must be a torchao PT2E Quantizer (VgfQuantizer, XNNPACKQuantizer, ...), "
                f"got {type(base).__name__}"
            )
        for name, value in (("input_qspecs", input_qspecs), ("output_qspecs", output_qspecs)):
            if isinstance(value, QuantizationSpecBase) or not isinstance(value, Sequence):
                raise TypeError(f"{name} must be a sequence of qspecs (one per {name[:-7]}put)")
        self.base = base
        self.input_qspecs = tuple(
            _check_qspec(q, f"input_qspecs[{k}]", True) for k, q in enumerate(input_qspecs)
        )
        self.output_qspecs = tuple(
            _check_qspec(q, f"output_qspecs[{k}]", True) for k, q in enumerate(output_qspecs)
        )
        self.grid_sampler_image_qspec = _check_qspec(
            snorm8() if grid_sampler_image_qspec is _DEFAULT else grid_sampler_image_qspec,
            "grid_sampler_image_qspec",
            False,
        )
        self.grid_sampler_grid_qspec = _check_qspec(
            snorm16() if grid_sampler_grid_qspec is _DEFAULT else grid_sampler_grid_qspec,
            "grid_sampler_grid_qspec",
            False,
        )
        self.grid_sampler_output_qspec = _check_qspec(
            snorm8() if grid_sampler_output_qspec is _DEFAULT else grid_sampler_output_qspec,
            "grid_sampler_output_qspec",
            False,
        )
        self.keep_grid_positions_float = keep_grid_positions_float
        self._arm_base = type(base).__module__.startswith("executorch.backends.arm")
        self._annotations: dict[str, QuantizationAnnotation] = {}

    # -- the Quantizer protocol -------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        result: GraphModule = self.base.transform_for_annotation(model)
        return result

    def annotate(self, model: GraphModule) -> GraphModule:
        inputs, outputs = user_inputs(model), user_outputs(model)
        output = next(n for n in model.graph.nodes if n.op == "output")
        self.check_counts(len(inputs), len(outputs))
        model = self.base.annotate(model)
        if self.keep_grid_positions_float:
            for node in grid_position_nodes(model):
                if ANNOTATION_KEY in node.meta:
                    logger.debug("grid position %s: base annotation removed", node.name)
                node.meta[ANNOTATION_KEY] = QuantizationAnnotation(_annotated=True)
                self._mark_arm(node, quantized=False)
        for node in model.graph.nodes:
            if is_grid_sampler(node):
                self._annotate_grid_sampler(node)
        for node, qspec in zip(inputs, self.input_qspecs, strict=True):
            self._annotate_boundary(node, qspec, f"input {node.name}")
        seen: dict[Node, QuantizationSpec | None] = {}
        for k, (node, qspec) in enumerate(zip(outputs, self.output_qspecs, strict=True)):
            if node in seen and seen[node] != qspec:
                raise ValueError(
                    f"output {k} is the same tensor ({node.name}) as an earlier output but asks "
                    "for different quantization; give both the same qspec"
                )
            seen[node] = qspec
            self._annotate_boundary(node, qspec, f"output {k}")
            # Some bases (Arm) also annotate the output node's inputs: the boundary decides.
            output_annotation = output.meta.get(ANNOTATION_KEY)
            if output_annotation is not None and node in output_annotation.input_qspec_map:
                output_annotation.input_qspec_map[node] = qspec
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
        if self.grid_sampler_output_qspec is not None:
            _share_with_consumers(node, self.grid_sampler_output_qspec)

    def _annotate_boundary(self, node: Node, qspec: QuantizationSpec | None, what: str) -> None:
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
            return
        self._mark_arm(node, quantized=True)
        _share_with_consumers(node, qspec)
        if node.op == "call_function" and (
            isinstance(base_output, SharedQuantizationSpec) or not base_quantized
        ):
            self._share_with_inputs(node, qspec)

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
            if shared or isinstance(source_annotation.output_qspec, QuantizationSpec):
                source_annotation.output_qspec = qspec
            if shared and source.op == "call_function":
                self._share_with_inputs(source, qspec)


def _is_float_activation(node: Node) -> bool:
    value = node.meta.get("val")
    return (
        node.op in ("call_function", "placeholder")
        and isinstance(value, torch.Tensor)
        and value.dtype.is_floating_point
    )


def _share_with_consumers(node: Node, qspec: QuantizationSpec) -> None:
    """Consumers that quantize ``node``'s output read it with ``qspec``, so that PT2E's prepare
    shares one observer (the qspecs are equal) instead of requantizing on each edge. Grid
    samplers keep their own input qspecs."""
    for user in node.users:
        annotation = user.meta.get(ANNOTATION_KEY)
        if annotation is None or is_grid_sampler(user):
            continue
        if annotation.input_qspec_map.get(node) is not None:
            annotation.input_qspec_map[node] = qspec
