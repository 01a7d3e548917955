"""``PolicyPartitioner``: any ExecuTorch partitioner, then partition tag policies."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram

from etkit_partition.policies import (
    DetagOps,
    PartitionPolicy,
    duplicate_dequantize,
    merge_partitions,
    repair_partitions,
)
from etkit_quant.graph import operator_name

logger = logging.getLogger(__name__)


class PolicyPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
    """Runs ``inner`` (any partitioner, ``VgfPartitioner`` in particular), applies each policy to
    the tagged program in order, repairs the partitions after each (see ``repair_partitions``)
    and drops tags no node carries any more. ``ops_to_not_decompose`` (less the operators a
    ``DetagOps`` keeps outside) is the inner partitioner's, and so is
    ``transform_for_pre_decomposition``, followed by ``duplicate_dequantize``.

    With ``merge``, partitions of the same backend that no outside path connects are then
    joined into one (``merge_partitions``): one delegate call where the inner partitioner left
    several unconnected pieces.

    Raises ``TypeError`` when ``inner`` is not a ``Partitioner`` or a policy has no ``apply``."""

    def __init__(
        self, inner: Partitioner, policies: Sequence[PartitionPolicy], merge: bool = False
    ) -> None:
        if not isinstance(inner, Partitioner):
            raise TypeError(
                f"inner must be an ExecuTorch Partitioner (VgfPartitioner, ...), got "
                f"{type(inner).__name__}"
            )
        for policy in policies:
            if not isinstance(policy, PartitionPolicy):
                raise TypeError(
                    "policies must have apply(program) (DetagOps, ...); got "
                    f"{type(policy).__name__}"
                )
        super().__init__(getattr(inner, "_spec", {}))
        self.inner = inner
        self.policies = tuple(policies)
        self.merge = merge
        self.detagged: dict[str, str] = {}  # node name -> the policy that left it outside

    @property
    def delegation_spec(self) -> Any:
        return getattr(self.inner, "delegation_spec", None)

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        ops, node_filter = self.inner.ops_to_not_decompose(ep)
        # An op a policy keeps outside is not the inner backend's to keep whole: EXIR requires
        # every op kept from decomposition to end up delegated.
        kept_outside: set[str] = set()
        for policy in self.policies:
            if isinstance(policy, DetagOps):
                kept_outside |= policy.targets
        kept = [op for op in ops if operator_name(op) not in kept_outside]
        return kept, node_filter

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """The inner partitioner's transform, then ``duplicate_dequantize`` (in place): every
        consumer of a dequantize gets its own, so that each can go into its consumer's
        partition (a partitioner may not change the graph)."""
        result: ExportedProgram = self.inner.transform_for_pre_decomposition(exported_program)
        duplicate_dequantize(result)
        return result

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = self.inner.partition(exported_program)
        program = result.tagged_exported_program
        tags: dict[str, Any] = dict(result.partition_tags)
        self.detagged = {}
        for policy in self.policies:
            for node in policy.apply(program):
                self.detagged[node.name] = type(policy).__name__
            tags = repair_partitions(program, tags)
        if self.merge:
            tags = merge_partitions(program, tags)
        return PartitionResult(tagged_exported_program=program, partition_tags=tags)
