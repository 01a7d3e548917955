"""The lowering's three shortcuts past upstream work that cannot change a program:
``xnnpack_patterns_only_where_they_match`` (two XNNPACK preprocess passes skip pattern matching
that cannot change the graph; their pattern graphs cost about 6 s of every new process's first
XNNPACK export), ``cia_ops_materialized_once`` (torch's decompositions materialize their ops
again only when the dispatcher's registrations changed) and ``codegen_deferred`` (graph modules
generate their Python code when it is used, not at every recompile). The program is the same
bytes with and without them (for VGF, with and without deferred code generation:
test_diagnostics.py's byte identity)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
import torch
import torch._export.utils as export_utils
import torch.nn.functional as F
from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import (
    ConvertToUpsampleBilinear2d,
)
from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
from executorch.exir.dialects._ops import ops as exir_ops

from etkit_exporter import export_model
from etkit_exporter.export import lowering
from etkit_exporter.export.lowering import (
    SDPA_PATTERN_OP,
    cia_ops_materialized_once,
    codegen_deferred,
    xnnpack_patterns_only_where_they_match,
)


def _ops(graph_module: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
def test_the_skipped_matching_could_not_have_changed_a_graph() -> None:
    """The facts the skip rests on, read from the installed ExecuTorch's own pattern graphs:
    when an upgrade changes them, this fails and the skip must be looked at again."""
    bilinear_patterns = bilinear_2d.get_graphs()
    assert bilinear_patterns
    for pattern in bilinear_patterns:  # one op, which the pass leaves as it is when matched
        assert _ops(pattern) == [exir_ops.edge.aten.upsample_bilinear2d.vec]
    sdpa_patterns = sdpa.get_graphs()
    assert sdpa_patterns
    for pattern in sdpa_patterns:
        assert SDPA_PATTERN_OP in _ops(pattern)


def test_upstreams_passes_are_back_after_the_block_even_when_it_raises() -> None:
    calls = ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call
    with pytest.raises(RuntimeError), xnnpack_patterns_only_where_they_match():
        with xnnpack_patterns_only_where_they_match():  # re-entrant
            pass
        assert (ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call) != calls
        raise RuntimeError("a failing stage")
    assert (ConvertToUpsampleBilinear2d.call, ConvertToSDPAPass.call) == calls


class _Upsampled(torch.nn.Module):
    """A bilinear upsample (XNNPACK's bilinear pass sees it), a softmax over channels (its SDPA
    pass matches, as upstream does) and a grid sampler."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(self.conv(image), scale_factor=2, mode="bilinear")
        weights = torch.softmax(up, dim=1)
        return F.grid_sample(up * weights, grid, align_corners=False)


@pytest.mark.slow
def test_export_is_byte_identical_with_and_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(VGF, deferred code generation: test_diagnostics' byte identity.)"""
    target = "xnnpack"
    model = _Upsampled().eval()
    generator = torch.Generator().manual_seed(1)
    inputs = (
        torch.rand(1, 3, 8, 12, generator=generator) * 2 - 1,
        torch.rand(1, 16, 24, 2, generator=generator) * 2 - 1,
    )
    skipped = export_model(model, inputs, artifacts_root=tmp_path / "skipped", target=target)
    for shortcut in (
        "xnnpack_patterns_only_where_they_match",
        "cia_ops_materialized_once",
        "codegen_deferred",
    ):
        monkeypatch.setattr(lowering, shortcut, contextlib.nullcontext)
    matched = export_model(model, inputs, artifacts_root=tmp_path / "matched", target=target)
    assert skipped.pte_path.read_bytes() == matched.pte_path.read_bytes()


class _Doubled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2,)


def _add_one(graph_module: torch.fx.GraphModule) -> None:
    """Rewrites the graph's multiply to ``x * 2 + 1``."""
    graph = graph_module.graph
    multiply = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_after(multiply):
        added = graph.call_function(torch.ops.aten.add.Tensor, (multiply, 1))
    multiply.replace_all_uses_with(added, delete_user_cb=lambda user: user is not added)


def test_deferred_code_is_generated_when_used_and_at_once_after_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside the block a graph module's recompile generates no code, and what calls it or reads
    its code or pytree specs gets the code of its graph as it is then; after the block (also
    when it raised) graph modules recompile at once, those made inside included."""
    generated: list[int] = []
    python_code = torch.fx.Graph.python_code

    def counted(self: torch.fx.Graph, *args: object, **kwargs: object) -> object:
        generated.append(1)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    x = torch.arange(4.0)
    with pytest.raises(RuntimeError), codegen_deferred():
        with codegen_deferred():  # re-entrant
            exported = torch.export.export(_Doubled(), (x,)).module()
            inside = torch.fx.GraphModule(exported, exported.graph)  # pytree code generation
        assert isinstance(inside, lowering._DeferredCodegen)
        generated.clear()
        _add_one(inside)
        inside.recompile()
        inside.recompile()
        assert generated == []
        assert inside._in_spec is not None and len(generated) == 1  # read: generated
        _add_one(inside)
        inside.recompile()
        assert inside(x)[0].tolist() == [2.0, 4.0, 6.0, 8.0]  # called: the graph as it is
        assert "add" in inside.code
        raise RuntimeError("a failing stage")
    assert torch.fx.GraphModule.__new__ is not lowering._new_graph_module
    generated.clear()
    _add_one(inside)
    inside.recompile()
    assert len(generated) == 1  # at once, as a GraphModule
    assert inside(x)[0].tolist() == [3.0, 5.0, 7.0, 9.0]
    outside = torch.fx.symbolic_trace(_Doubled())
    assert not isinstance(outside, lowering._DeferredCodegen)


def test_cia_ops_are_materialized_again_only_for_new_registrations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside the block, torch's collection of CompositeImplicitAutograd ops (what
    ``run_decompositions`` walks, once per op namespace) materializes them once, and again
    when an op is registered meanwhile, which the collection then holds; the function it
    replaced is back after the block, also when it raises."""
    upstream = export_utils._materialize_cpp_cia_ops
    runs: list[int] = []

    def counted() -> None:
        runs.append(1)
        upstream()

    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", counted)
    monkeypatch.setattr(lowering, "_cia_materialized", None)
    export_utils._collect_all_valid_cia_ops()
    walked = len(runs)
    assert walked > 1  # upstream: once per namespace walked
    with pytest.raises(RuntimeError), cia_ops_materialized_once():
        with cia_ops_materialized_once():  # re-entrant
            export_utils._collect_all_valid_cia_ops()
            export_utils._collect_all_valid_cia_ops()
        assert len(runs) == walked + 1
        library = torch.library.Library("etkit_cia_test", "DEF")
        library.define("double(Tensor x) -> Tensor")
        library.impl("double", lambda x: x * 2, "CompositeImplicitAutograd")
        collected = export_utils._collect_all_valid_cia_ops()
        assert len(runs) == walked + 2
        assert torch.ops.etkit_cia_test.double.default in collected
        raise RuntimeError("a failing stage")
    assert export_utils._materialize_cpp_cia_ops is counted


def test_other_threads_make_graph_modules_as_ever() -> None:
    """Only the thread inside the block defers: a graph module another thread makes meanwhile
    generates its code at every recompile, as ever."""
    made: list[torch.fx.GraphModule] = []
    with codegen_deferred():
        other = threading.Thread(target=lambda: made.append(torch.fx.symbolic_trace(_Doubled())))
        other.start()
        other.join()
        inside = torch.fx.symbolic_trace(_Doubled())
    assert isinstance(inside, lowering._DeferredCodegen)
    assert len(made) == 1 and not isinstance(made[0], lowering._DeferredCodegen)
