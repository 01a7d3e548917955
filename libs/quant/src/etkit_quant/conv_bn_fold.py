"""torchao's conversion of a graph that holds a batch norm, without exporting patterns that
cannot match.

``convert_pt2e`` folds each QAT conv + batch norm (``_fold_conv_bn_qat``) by one helper call per
conv function (``F.conv1d``, ``F.conv2d``, ``F.conv_transpose1d``, ``F.conv_transpose2d``), and
each call exports its match and replacement patterns with ``torch.export`` (12 variants of each:
per-channel or not, bias or not, quantized bias or not, training or not): 108 strict exports in
every conversion of a graph with a batch norm, nothing cached, about 50 s on this project's 2-core
machine for a conv and a batch norm. A pattern of one conv function holds that function's ``aten``
op, so it cannot match a graph without one; ``conv_bn_folds_only_where_they_match`` skips the
pattern matching of every conv function the graph holds no node of and runs the rest of
torchao's helper for it (its dead-code removal and its duplicating and merging of dequantizes),
so the converted graph is the one torchao gives (tests/test_conv_bn_fold.py compares both). A
graph with a convolution of another kind (``conv3d``, ``aten.convolution``) is converted as
torchao does, every pattern exported.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch.fx import GraphModule
from torchao.quantization.pt2e import qat_utils
from torchao.quantization.pt2e.utils import _is_conv_or_conv_transpose_node

from etkit_quant.patching import PatchedWhileEntered

_aten = torch.ops.aten

CONV_TARGETS: Final[dict[Callable[..., Any], frozenset[object]]] = {
    F.conv1d: frozenset({_aten.conv1d.default, _aten.conv1d.padding}),
    F.conv2d: frozenset({_aten.conv2d.default, _aten.conv2d.padding}),
    F.conv_transpose1d: frozenset({_aten.conv_transpose1d, _aten.conv_transpose1d.default}),
    F.conv_transpose2d: frozenset({_aten.conv_transpose2d, _aten.conv_transpose2d.input}),
}
"""The ``aten`` ops a conv function's fold patterns are made of (each function's own: what
torch.export gives for it in torchao's patterns, which the tests check)."""


def conv_functions_in(model: GraphModule) -> set[Callable[..., Any]] | None:
    """The conv functions of ``CONV_TARGETS`` whose ops ``model`` holds; ``None`` when it holds a
    convolution of none of them (then nothing may be skipped)."""
    found: set[Callable[..., Any]] = set()
    for node in model.graph.nodes:
        if not _is_conv_or_conv_transpose_node(node):
            continue
        kinds = [fn for fn, targets in CONV_TARGETS.items() if node.target in targets]
        if not kinds:
            return None
        found.update(kinds)
    return found


def helper_without_patterns(m: GraphModule) -> GraphModule:
    """torchao's ``_fold_conv_bn_qat_helper`` where none of its patterns matches: its steps
    before and after the pattern matching (the ExecuTorch-pinned torchao's, checked by the
    tests against the helper itself)."""
    m.graph.eliminate_dead_code()
    m.recompile()
    qat_utils._duplicate_dequantize_node(m)
    m.recompile()
    qat_utils._remove_extra_dequantize(m)
    m.graph.eliminate_dead_code()
    m.recompile()
    return m


_original_helper: Final = qat_utils._fold_conv_bn_qat_helper


def _helper(
    m: GraphModule, conv_fn: Callable[..., Any], example_inputs: tuple[Any, ...], is_cuda: bool
) -> GraphModule:
    present = conv_functions_in(m)
    if present is not None and conv_fn in CONV_TARGETS and conv_fn not in present:
        return helper_without_patterns(m)
    result: GraphModule = _original_helper(m, conv_fn, example_inputs, is_cuda)
    return result


def _install() -> None:
    qat_utils._fold_conv_bn_qat_helper = _helper


def _restore() -> None:
    qat_utils._fold_conv_bn_qat_helper = _original_helper


_patch = PatchedWhileEntered(_install, _restore)


def conv_bn_folds_only_where_they_match() -> AbstractContextManager[None]:
    """While entered, ``convert_pt2e`` matches the batch-norm fold patterns only of the conv
    functions the graph holds. Re-entrant and thread-safe; torchao's helper is back on the last
    exit, also after a raise."""
    return _patch.entered()
