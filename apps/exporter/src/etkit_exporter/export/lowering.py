"""Lowering for a target: the partitioners and the backend's passes (VGF: the samplers inside
the VGF where they can run there; XNNPACK), which path each grid sampler took, and compile specs
that would write build paths into the program."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
import torch._export.utils as export_utils
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import (
    ConvertToUpsampleBilinear2d,
)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    get_symmetric_quantization_config as xnnpack_config,
)
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram
from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph import PythonCode
from torch.fx.passes.infra.pass_base import PassResult

from etkit_exporter.vgf.tools import configure_model_converter
from etkit_gridsampler.vgf_shader import (
    IN_VGF,
    OWN_DELEGATE,
    sampler_lowering,
)
from etkit_partition import instance_norms_as_moments
from etkit_quant.graph import is_grid_sampler
from etkit_quant.patching import PatchedWhileEntered

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


# Compile-spec keys that hold a folder of the machine that lowered the program (the Arm backend's
# intermediates); no runtime reads them, and a shipped program must not carry them.
BUILD_PATH_COMPILE_SPECS: Final = frozenset({"debug_artifact_path"})

# A grid sampler no delegate took (etkit's refused it too): ExecuTorch's portable float kernel.
PORTABLE_KERNEL: Final = "portable-float-kernel"


def strip_build_paths(program: ExportedProgram) -> list[str]:
    """Removes the compile specs of ``BUILD_PATH_COMPILE_SPECS`` from every lowered module of
    ``program`` (nested ones included), so that the serialized program holds no path of this
    machine and two exports of one model are byte-identical. Returns the removed keys."""

    removed: list[str] = []
    for module in program.graph_module.modules():
        if isinstance(module, LoweredBackendModule):
            kept = [c for c in module.compile_specs if c.key not in BUILD_PATH_COMPILE_SPECS]
            removed += [c.key for c in module.compile_specs if c.key in BUILD_PATH_COMPILE_SPECS]
            module._compile_specs = kept
    return removed


def drop_unread_state(program: ExportedProgram) -> int:
    """Removes from ``program``'s state dict every entry no input of its graph reads, returning
    their bytes. torch.export keeps a module's whole ``state_dict()``: after PT2E's
    ``convert_pt2e`` folds each weight's quantize into an int8 constant, the float weights it
    replaced stay registered on the converted module, unread (a third of the RIFE IFNet
    re-creation's record: 22.2 MB in each of the ATen and edge programs). Every copy of the
    program (the lowering's deep copies, the ETRecord's programs) then carries them."""
    signature = program.graph_signature
    read = {
        *signature.inputs_to_parameters.values(),
        *signature.inputs_to_buffers.values(),
    }
    unread = [name for name in program.state_dict if name not in read]
    dropped = 0
    for name in unread:
        tensor = program.state_dict.pop(name)
        dropped += tensor.numel() * tensor.element_size()
    return dropped


def program_for_target(program: ExportedProgram, target: str) -> ExportedProgram:
    """The re-exported program as ``target``'s lowering takes it: its unread state dropped
    (``drop_unread_state``) and, for XNNPACK, each instance norm written in ops XNNPACK lowers
    (``etkit_partition.instance_norms_as_moments``; outside, it is a single-threaded portable
    float kernel)."""
    drop_unread_state(program)
    return instance_norms_as_moments(program) if target == "xnnpack" else program


# The op every pattern graph of XNNPACK's ConvertToSDPAPass holds (its softmax): a graph without
# one holds no match (apps/exporter/tests/test_xnnpack_patterns.py checks upstream's patterns).
SDPA_PATTERN_OP: Final = exir_ops.edge.aten._softmax.default


def _retraced(pass_: Any, owner: Any, graph_module: GraphModule) -> PassResult:
    """What ``owner.call`` does after its pattern matching found nothing: a recompile and its
    base pass's retrace."""
    graph_module.recompile()
    base: Any = super(owner, pass_)
    return PassResult(base.call(graph_module).graph_module, True)


_bilinear_call, _sdpa_call = ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call


def _bilinear(self: ConvertToUpsampleBilinear2d, graph_module: GraphModule) -> PassResult:
    return _retraced(self, ConvertToUpsampleBilinear2d, graph_module)


def _sdpa(self: ConvertToSDPAPass, graph_module: GraphModule) -> PassResult:
    if any(node.target == SDPA_PATTERN_OP for node in graph_module.graph.nodes):
        return _sdpa_call(self, graph_module)  # type: ignore[no-any-return]
    return _retraced(self, ConvertToSDPAPass, graph_module)


def _skip_pattern_matching() -> None:
    ConvertToUpsampleBilinear2d.call = _bilinear
    ConvertToSDPAPass.call = _sdpa


def _match_patterns() -> None:
    ConvertToUpsampleBilinear2d.call = _bilinear_call
    ConvertToSDPAPass.call = _sdpa_call


_patterns = PatchedWhileEntered(_skip_pattern_matching, _match_patterns)


@contextmanager
def xnnpack_patterns_only_where_they_match() -> Iterator[None]:
    """While it is entered (re-entrant, and across threads), two of XNNPACK's preprocess passes
    skip pattern matching that cannot change the graph they are given; each still recompiles
    and retraces it as upstream does, so the program is the same bytes. Their pattern graphs are
    exported the first time a process uses them: 9 ``run_decompositions``, about 6 s of every
    CLI export for XNNPACK (the flow-warp demo's export: 13.1 -> 6.7 s).

    - ``ConvertToUpsampleBilinear2d``: its patterns (ExecuTorch 1.5.1) are each one
      ``upsample_bilinear2d.vec``, and a match whose output is that op is left as it is ("Op
      was not decomposed, do nothing"): it never changes a graph.
    - ``ConvertToSDPAPass``: every pattern holds a ``_softmax`` (``SDPA_PATTERN_OP``); a graph
      without one is not matched.

    ``apps/exporter/tests/test_xnnpack_patterns.py`` checks both facts against the installed
    patterns."""
    with _patterns.entered():
        yield


_cia_upstream: Callable[[], None] = export_utils._materialize_cpp_cia_ops
_cia_materialized: tuple[str, ...] | None = None


def _materialize_cia_ops_when_registered() -> None:
    """Upstream's ``torch._export.utils._materialize_cpp_cia_ops``, run only when the C++
    dispatcher's CompositeImplicitAutograd registrations differ from those it last
    materialized."""
    global _cia_materialized

    registered = tuple(
        torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    )
    if registered != _cia_materialized:
        _cia_upstream()
        _cia_materialized = registered


@contextmanager
def cia_ops_materialized_once() -> Iterator[None]:
    """While it is entered (re-entrant, and across threads), torch's decompositions
    materialize the dispatcher's CompositeImplicitAutograd ops into ``torch.ops`` (a ``getattr``
    per op, about 840 ops) only when their registrations changed since they last did.
    Upstream materializes them all again for each op namespace it walks: 215 times in each
    lowering of the flow-warp demo (5 collections of 43 namespaces), 4 ms each on this machine.
    The ``getattr`` only creates the op objects that are not there yet, so doing it again for
    the same registrations changes nothing; a new registration (a library loaded meanwhile) is
    materialized as upstream would."""
    with _cia.entered():
        yield


def _materialize_once() -> None:
    global _cia_upstream

    _cia_upstream = export_utils._materialize_cpp_cia_ops  # what it replaces, restored after
    export_utils._materialize_cpp_cia_ops = _materialize_cia_ops_when_registered


def _materialize_as_upstream() -> None:
    export_utils._materialize_cpp_cia_ops = _cia_upstream


_cia = PatchedWhileEntered(_materialize_once, _materialize_as_upstream)


class _DeferredCodegen(_LazyGraphModule):
    """A graph module made in a thread inside ``codegen_deferred``. While that thread is inside,
    its ``recompile`` only marks its Python code stale, as torch's ``_LazyGraphModule`` does,
    and the code is generated when something calls it or reads its code; otherwise
    ``recompile`` generates it at once, as a ``GraphModule``'s does."""

    def recompile(self) -> PythonCode | None:  # type: ignore[override]
        if getattr(_deferring, "depth", 0):
            type(self).forward = type(self)._lazy_forward
            return None
        return self._real_recompile()

    def __getattr__(self, name: str) -> Any:
        # set by code generation (pytree in and out specs; the code), read without calling it
        if name in ("_in_spec", "_out_spec", "_code") and type(self)._needs_recompile():
            self.real_recompile()
            return getattr(self, name)
        return super().__getattr__(name)


_graph_module_new = GraphModule.__new__
_deferring = threading.local()  # depth: how deep this thread is in codegen_deferred


def _new_graph_module(cls: type[GraphModule], *args: Any, **kwargs: Any) -> GraphModule:
    # GraphModule.__new__ makes a class per instance ("GraphModuleImpl") below the one asked for
    base = next(t for t in cls.__mro__ if not t.__qualname__.endswith("GraphModuleImpl"))
    deferred = base is GraphModule and getattr(_deferring, "depth", 0) > 0
    return _graph_module_new(_DeferredCodegen if deferred else cls, *args, **kwargs)


def _defer_codegen() -> None:
    GraphModule.__new__ = _new_graph_module  # type: ignore[assignment]


def _generate_at_once() -> None:
    GraphModule.__new__ = _graph_module_new  # type: ignore[method-assign]


_codegen = PatchedWhileEntered(_defer_codegen, _generate_at_once)


@contextmanager
def codegen_deferred() -> Iterator[None]:
    """While a thread is inside (re-entrant), the graph modules torch.fx makes in it generate
    their Python code only when called or read (``_DeferredCodegen``), not at every
    ``recompile``: the Arm backend's passes recompile after each of them (684 code generations
    in a VGF export of the flow-warp demo, 385 of them in the lowering), and nearly all of those
    graphs are only ever interpreted or rewritten again. Other threads' modules are made as
    ever. After the block, such a module generates its code when called or read, and at once
    at each ``recompile``, as a ``GraphModule`` does. The programs are the same bytes
    (tested)."""
    with _codegen.entered():
        _deferring.depth = getattr(_deferring, "depth", 0) + 1
        try:
            yield
        finally:
            _deferring.depth -= 1


@contextmanager
def lowering_to(in_vgf: bool) -> Iterator[list[dict[str, Any]]]:
    """The context of ``to_edge_transform_and_lower`` for a target: torch's decompositions
    materialize their ops once (``cia_ops_materialized_once``), graph modules generate their
    code when it is used (``codegen_deferred``). To VGF: etkit's samplers
    become compute segments (etkit_gridsampler's rewrite pass runs before the Arm backend's own
    grid-sampler passes); yields the segments made. To XNNPACK: its pattern matching runs only
    where it can change the graph (``xnnpack_patterns_only_where_they_match``); yields ``[]``."""
    # the report handlers close on every route: a VGF export whose samplers stay in etkit's
    # delegate partitions with the Arm partitioner too
    with cia_ops_materialized_once(), codegen_deferred(), _partition_reports_closed():
        if not in_vgf:
            with xnnpack_patterns_only_where_they_match():
                yield []
            return

        with sampler_lowering() as segments:
            yield segments


# The Arm partitioner's logger: where it logs INFO (pytest, --verbose) it adds a FileHandler
# writing its intermediates' partition_report.txt at each partition call and never removes it,
# so a later export in the same process appended to an earlier export's report after that
# export's manifest was written (and kept the file open)
_ARM_PARTITIONER_LOGGER: Final = "executorch.backends.arm.tosa.partitioner"


@contextmanager
def _partition_reports_closed() -> Iterator[None]:
    """Closes and removes the file handlers the Arm partitioner adds inside this block."""
    log = logging.getLogger(_ARM_PARTITIONER_LOGGER)
    before = list(log.handlers)
    try:
        yield
    finally:
        for handler in [h for h in log.handlers if h not in before]:
            if isinstance(handler, logging.FileHandler):
                log.removeHandler(handler)
                handler.close()


def sampler_paths(
    partitioner: Any,
    program: ExportedProgram,
    segments: list[dict[str, Any]] | None,
    target: str,
    rejected: dict[str, str],
) -> list[dict[str, Any]]:
    """Which way each grid sampler of ``program`` (the edge program before etkit's delegate)
    went, said on the console too: a compute segment inside the VGF (with its configuration),
    etkit's own delegate (with the reason it is not in the VGF), or, for the samplers etkit's
    delegate refused too (``rejected``: node name -> why), ExecuTorch's portable float kernel."""

    if segments is None:
        left = [n.name for n in program.graph_module.graph.nodes if is_grid_sampler(n)]
        why = (
            "sampler_delegate: samplers kept in etkit's own delegate"
            if target == "vgf"
            else f"target {target}: etkit's own delegate"
        )
        paths = [{"node": name, "path": OWN_DELEGATE, "reason": why} for name in left]
    else:
        paths = [p.as_dict() for p in getattr(partitioner, "paths", [])]
    made = {segment["node"]: segment for segment in segments or []}
    for path in paths:
        segment = made.get(str(path["node"]))
        if segment is not None:
            op = segment["op"]
            path["segment"] = {
                "mode": op.mode,
                "padding_mode": op.padding_mode,
                "align_corners": op.align_corners,
                "image_shape": list(segment["image_shape"]),
                "grid_shape": list(segment["grid_shape"]),
                "grid_dtype": str(op.grid.dtype).removeprefix("torch."),
                "params": segment["params_mode"],
                "workgroups": segment["workgroups"],
            }
            if "channels_padded_to" in segment:  # buffers made whole 32-bit words
                path["segment"]["channels_padded_to"] = segment["channels_padded_to"]
        refused = rejected.get(str(path["node"]))
        if path["path"] == IN_VGF:
            logger.info("grid sampler %s: a compute segment inside the VGF", path["node"])
        elif refused is not None:
            path["path"], path["reason"] = PORTABLE_KERNEL, refused
            logger.warning(
                "grid sampler %s is not delegated (it runs as ExecuTorch's portable float "
                "kernel, on the CPU): %s",
                path["node"],
                refused,
            )
        elif segments is not None:
            logger.warning(
                "grid sampler %s stays outside the VGF, in etkit's own delegate: %s",
                path["node"],
                path["reason"],
            )
    return paths


def target_backend(target: str, intermediates: Path, tosa_spec: str) -> tuple[Any, Any, str | None]:
    """The base quantizer, the main partitioner and the TOSA spec of a target."""
    if target == "vgf":
        configure_model_converter()
        spec = VgfCompileSpec(tosa_spec)
        spec.dump_intermediate_artifacts_to(str(intermediates))
        base = VgfQuantizer(spec)
        base.set_global(get_symmetric_quantization_config())
        return base, VgfPartitioner(spec), tosa_spec

    return XNNPACKQuantizer().set_global(xnnpack_config()), XnnpackPartitioner(), None
