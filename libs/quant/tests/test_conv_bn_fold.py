"""The batch-norm fold without the patterns that cannot match (``etkit_quant.conv_bn_fold``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_qat import BatchNormWarp, frames, train, vgf_quantizer
from torch.fx import GraphModule
from torchao.quantization.pt2e import qat_utils, quantize_pt2e
from torchao.quantization.pt2e.utils import _get_aten_graph_module_for_pattern

from etkit_quant import convert_qat, prepare_qat
from etkit_quant.conv_bn_fold import (
    CONV_TARGETS,
    conv_bn_folds_only_where_they_match,
    conv_functions_in,
    helper_without_patterns,
)

_INPUTS_1D = tuple(torch.randn(s) for s in [(1, 1, 3), (1, 1, 1), (1,), (1,), (1,), (1,)])
_INPUTS_2D = tuple(torch.randn(s) for s in [(1, 1, 3, 3), (1, 1, 1, 1), (1,), (1,), (1,), (1,)])


def _conv_targets(pattern: GraphModule) -> set[object]:
    return {
        n.target
        for n in pattern.graph.nodes
        if n.op == "call_function" and "conv" in str(n.target) and "batch_norm" not in str(n.target)
    }


@pytest.mark.parametrize("conv_fn", list(CONV_TARGETS), ids=lambda fn: fn.__name__)
def test_upstream_fold_patterns_hold_only_their_conv_functions_ops(conv_fn: Any) -> None:
    """What the skip rests on: each conv function's match pattern, as torchao exports it, is made
    of that function's ops (``CONV_TARGETS``) and of no other function's."""
    inputs = _INPUTS_1D if conv_fn in (F.conv1d, F.conv_transpose1d) else _INPUTS_2D
    for per_channel, has_bias, training in [(True, True, True), (False, False, False)]:
        kwargs = qat_utils._get_quantized_conv_bn_example_inputs_kwargs(
            per_channel, has_bias, has_bias, False
        )
        pattern = qat_utils._get_quantized_qat_conv_bn_pattern(
            per_channel, has_bias, has_bias, conv_fn, training
        )
        targets = _conv_targets(
            _get_aten_graph_module_for_pattern(pattern, inputs, False, **kwargs)
        )
        assert targets and targets <= CONV_TARGETS[conv_fn], (conv_fn.__name__, targets)
        for other, its_targets in CONV_TARGETS.items():
            if other is not conv_fn:
                assert not targets & its_targets, (conv_fn.__name__, other.__name__)


def _graph_torchao_folds() -> GraphModule:
    """The graph ``convert_pt2e`` hands its fold: a trained QAT conv + batch norm (conv2d only)."""
    samples = frames(3)
    prepared = prepare_qat(BatchNormWarp(), samples[0], vgf_quantizer(), calibration=samples)
    train(prepared, samples, 1, lambda out, s: F.mse_loss(out, s[1]))
    prepared.eval()
    seen: list[GraphModule] = []

    def record(m: GraphModule) -> GraphModule:
        seen.append(copy.deepcopy(m))
        return m  # not folded: only the graph is wanted

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_pt2e, "_fold_conv_bn_qat", record)  # convert_pt2e's name for it
        convert_qat(prepared)
    (graph,) = seen
    return graph


def test_upstream_skipped_function_leaves_the_graph_torchaos_helper_leaves() -> None:
    """On a graph without ``conv1d``, torchao's helper for it (24 pattern exports) and the
    skip give the same code and the same constants; the graph holds ``conv2d`` only."""
    graph = _graph_torchao_folds()
    assert conv_functions_in(graph) == {F.conv2d}
    # what the helper's own steps act on: a quantize read by two equal dequantizes, a dead node
    dq = next(n for n in graph.graph.nodes if "dequantize_per_tensor" in str(n.target))
    with graph.graph.inserting_after(dq):
        twin = graph.graph.call_function(dq.target, dq.args, dq.kwargs)
    with graph.graph.inserting_after(twin):
        graph.graph.call_function(torch.ops.aten.neg.default, (twin,))
    next(iter(dq.users)).replace_input_with(dq, twin)
    graph.recompile()
    theirs = qat_utils._fold_conv_bn_qat_helper(copy.deepcopy(graph), F.conv1d, _INPUTS_1D, False)
    ours = helper_without_patterns(copy.deepcopy(graph))
    assert ours.code == theirs.code
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name


def test_torchaos_helper_is_back_after_the_block_also_after_a_raise() -> None:
    """(The conversion matching conv2d's patterns only: test_qat's batch-norm fold.)"""
    original = qat_utils._fold_conv_bn_qat_helper
    with pytest.raises(RuntimeError), conv_bn_folds_only_where_they_match():
        with conv_bn_folds_only_where_they_match():  # re-entered: restored on the last exit
            assert qat_utils._fold_conv_bn_qat_helper is not original
        assert qat_utils._fold_conv_bn_qat_helper is not original
        raise RuntimeError
    assert qat_utils._fold_conv_bn_qat_helper is original


def test_an_unknown_convolution_skips_nothing() -> None:
    """A conv3d (no function of ``CONV_TARGETS``) means every pattern is matched."""

    class Conv3dThenConv2d(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv3d = torch.nn.Conv3d(1, 1, 1)
            self.conv2d = torch.nn.Conv2d(2, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv2d(self.conv3d(x)[:, 0])

    graph = torch.export.export(Conv3dThenConv2d(), (torch.randn(1, 1, 2, 4, 4),)).module()
    assert conv_functions_in(graph) is None
