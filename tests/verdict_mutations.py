"""Miscompilations injected into the program etkit writes, never into its references: the
mutation suite that attacks the verdict (tests/test_verdict_mutations.py in CI, every mutation
on every model and target from bench/verdict_mutations.py).

Each mutation rewrites the edge program as the partitioner receives it: after the ETRecord's
reference graph was copied (``to_edge_transform_and_lower`` copies it before partitioning) and
never touching the quantized PT2E model the verdict runs, so the program computes something
else and the references do not change. ``run_mutation`` exports the model with the mutation in
place and ``verify=True`` (the real pipeline, the real backends, the real verdict), checks that
it fired (the program's outputs differ from the clean program's, the references are the clean
export's) and reports whether the verdict caught it, with the mutation's size against the
rounding envelope (``size``: its error power over the envelope's, from the clean program).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from executorch.exir.dialects._ops import ops as exir_ops

Mutation = Callable[[Any], "str | None"]  # edits an ExportedProgram; None: does not apply


# -- finding things in the edge graph -----------------------------------------------------------


def _calls(ep: Any, name: str) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and name in str(n.target)]


def _is(node: Any, name: str) -> bool:
    return isinstance(node, torch.fx.Node) and name in str(node.target)


def _quantize_user(node: torch.fx.Node) -> torch.fx.Node | None:
    return next(
        (u for u in node.users if _is(u, "quantize_per_tensor") and not _is(u, "dequantize")),
        None,
    )


def _sampler(ep: Any) -> torch.fx.Node | None:
    samplers = _calls(ep, "grid_sampler_2d")
    return samplers[0] if samplers else None


def _grid_quantize(ep: Any) -> torch.fx.Node | None:
    """The quantize whose value the first sampler reads as its grid."""
    sampler = _sampler(ep)
    if sampler is None:
        return None
    grid = sampler.args[1]
    while isinstance(grid, torch.fx.Node) and _is(grid, "dequantize"):
        grid = grid.args[0]
    return grid if isinstance(grid, torch.fx.Node) and _is(grid, "quantize_per_tensor") else None


def _image_quantize(ep: Any) -> torch.fx.Node | None:
    sampler = _sampler(ep)
    image = sampler.args[0] if sampler is not None else None
    if _is(image, "dequantize") and isinstance(image, torch.fx.Node):
        source = image.args[0]
        return source if isinstance(source, torch.fx.Node) else None
    return None


def _constant(ep: Any, placeholder: Any) -> tuple[dict[str, Any], str] | None:
    """Where a lifted parameter, buffer or constant placeholder's tensor lives."""
    if not isinstance(placeholder, torch.fx.Node) or placeholder.op != "placeholder":
        return None
    signature = ep.graph_signature
    for mapping, store in (
        (signature.inputs_to_parameters, ep.state_dict),
        (signature.inputs_to_buffers, ep.state_dict),
        (signature.inputs_to_lifted_tensor_constants, ep.constants),
    ):
        key = mapping.get(placeholder.name)
        if key is not None:
            return (store if key in store else ep.constants), key
    return None


def _replace(ep: Any, placeholder: Any, edit: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Replaces a constant with an edited copy (never in place: the references share storage)."""
    found = _constant(ep, placeholder)
    if found is None:
        return False
    store, key = found
    old = store[key]
    new = edit(old.detach().clone())
    store[key] = (
        torch.nn.Parameter(new, requires_grad=False) if isinstance(old, torch.nn.Parameter) else new
    )
    return True


def _insert_after(ep: Any, node: torch.fx.Node, op: Any, *args: Any) -> torch.fx.Node:
    """``op(node, *args)`` between ``node`` and all its users."""
    graph = ep.graph
    with graph.inserting_after(node):
        new = graph.call_function(op, (node, *args))
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    return new


def _add_to_bias(ep: Any, bias: Any, amount: float) -> bool:
    """Adds ``amount`` (real units) to a bias: a float constant, or the integers of a
    quantized one (in steps of its scale, per tensor or per channel)."""
    if not _is(bias, "dequantize"):
        return _replace(ep, bias, lambda b: b + amount)
    assert isinstance(bias, torch.fx.Node)
    scale = bias.args[1]
    if isinstance(scale, torch.fx.Node):  # per channel: a constant of scales
        found = _constant(ep, scale)
        if found is None:
            return False
        scales = found[0][found[1]].double()
    else:
        scales = torch.tensor(float(scale), dtype=torch.float64)
    return _replace(
        ep, bias.args[0], lambda b: (b.double() + torch.round(amount / scales)).to(b.dtype)
    )


def _linear_ops(ep: Any) -> list[torch.fx.Node]:
    return [*_calls(ep, "convolution"), *_calls(ep, "aten.linear"), *_calls(ep, "aten.addmm")]


def _bias_of(node: torch.fx.Node) -> Any:
    if _is(node, "addmm"):
        return node.args[0]
    return node.args[2] if len(node.args) > 2 else None


def _output_step(node: torch.fx.Node) -> float | None:
    q = _quantize_user(node)
    if q is None:
        for user in node.users:  # conv -> relu -> quantize
            q = _quantize_user(user)
            if q is not None:
                break
    return float(q.args[1]) if q is not None else None


def _coordinate_op(ep: Any) -> torch.fx.Node | None:
    """The linear op (conv, linear, addmm) nearest upstream of the first sampler's grid."""
    grid = _grid_quantize(ep)
    sampler = _sampler(ep)
    start = grid if grid is not None else (sampler.args[1] if sampler is not None else None)
    frontier, seen = [start], set()
    while frontier:
        node = frontier.pop(0)
        if not isinstance(node, torch.fx.Node) or node.name in seen:
            continue
        seen.add(node.name)
        if node in _linear_ops(ep):
            return node
        frontier.extend(node.all_input_nodes)
    return None


# -- the mutations ------------------------------------------------------------------------------


def coordinate_bias(steps: float) -> Mutation:
    """The bias of the op predicting the flow or theta (nearest upstream of the grid) compiled
    ``steps`` of its output step too high."""

    def mutate(ep: Any) -> str | None:
        op = _coordinate_op(ep)
        step = _output_step(op) if op is not None else None
        if op is None or step is None:
            return None
        amount = steps * step
        if not _add_to_bias(ep, _bias_of(op), amount):
            return None
        return f"{op.name}'s bias +{amount:.4g} ({steps:g} steps)"

    return mutate


def bias_everywhere(steps: float) -> Mutation:
    """Every conv/linear bias moved by ``steps`` of its output step (-0.5: truncation)."""

    def mutate(ep: Any) -> str | None:
        done = []
        for op in _linear_ops(ep):
            step = _output_step(op)
            if step is not None and _add_to_bias(ep, _bias_of(op), steps * step):
                done.append(op.name)
        return f"{len(done)} biases {steps:+g} steps" if done else None

    return mutate


def weight_scale(factor: float, first_channel_only: bool) -> Mutation:
    """The first conv/linear's weights dequantized with a scale ``factor`` off (one output
    channel's where the weights are per channel, or ``first_channel_only``)."""

    def mutate(ep: Any) -> str | None:
        for op in _linear_ops(ep):
            weight = op.args[1] if not _is(op, "addmm") else op.args[2]
            if not _is(weight, "dequantize") or not isinstance(weight, torch.fx.Node):
                continue
            if _is(weight, "per_channel"):

                def edit(s: torch.Tensor) -> torch.Tensor:
                    if first_channel_only:
                        s[0] *= factor
                        return s
                    return s * factor

                if _replace(ep, weight.args[1], edit):
                    return f"{op.name}'s weight scale x{factor:g} (per channel)"
            elif not first_channel_only:
                weight.args = (weight.args[0], float(weight.args[1]) * factor, *weight.args[2:])
                return f"{op.name}'s weight scale x{factor:g}"
            else:  # per tensor: scale one output channel's weights
                if _replace(ep, weight.args[0], lambda w: _scaled_channel(w, factor)):
                    return f"{op.name}'s first output channel's weights x{factor:g}"
        return None

    return mutate


def _scaled_channel(w: torch.Tensor, factor: float) -> torch.Tensor:
    info = torch.iinfo(w.dtype)
    w[0] = torch.clamp(torch.round(w[0].double() * factor), info.min, info.max).to(w.dtype)
    return w


def sampled_image(kind: str, dim: int = 1) -> Mutation:
    """The int8 image the first sampler reads, its channels flipped (``flip``) or shifted by one
    pixel along ``dim`` (``shift``: a slice and a concatenation, Core ATen ops both targets
    lower)."""

    def mutate(ep: Any) -> str | None:
        image = _image_quantize(ep)
        value = image.meta.get("val") if image is not None else None
        if image is None or not isinstance(value, torch.Tensor):
            return None
        if kind == "flip":
            _insert_after(ep, image, exir_ops.edge.aten.flip.default, [1])
            return "the sampled image's channels flipped"
        size = int(value.shape[dim])
        graph = ep.graph
        users = list(image.users)
        with graph.inserting_after(image):
            last = graph.call_function(
                exir_ops.edge.aten.slice_copy.Tensor, (image, dim, size - 1, size)
            )
        with graph.inserting_after(last):
            rest = graph.call_function(
                exir_ops.edge.aten.slice_copy.Tensor, (image, dim, 0, size - 1)
            )
        with graph.inserting_after(rest):
            shifted = graph.call_function(exir_ops.edge.aten.cat.default, ([last, rest], dim))
        for node, shape in ((last, 1), (rest, size - 1), (shifted, size)):
            fake = list(value.shape)
            fake[dim] = shape
            node.meta = dict(image.meta)
            node.meta["val"] = value.new_empty(fake)
        for user in users:
            user.replace_input_with(image, shifted)
        return f"the sampled image shifted one pixel along dim {dim}"

    return mutate


def flow_component_swap(ep: Any) -> str | None:
    """The two channels of the flow swapped (x for y), on the quantized flow."""
    op = _coordinate_op(ep)
    if op is None:
        return None
    q = _quantize_user(op)
    value = op.meta.get("val")
    if q is None or not isinstance(value, torch.Tensor) or value.dim() != 4 or value.shape[1] != 2:
        return None
    _insert_after(ep, q, exir_ops.edge.aten.flip.default, [1])
    return f"{op.name}'s two flow components swapped"


def grid_math(kind: str, amount: float) -> Mutation:
    """The float grid before its quantize: ``zoom`` (times ``amount``), ``shift`` (``amount``
    pixels of the sampled image's width, both axes in normalized units), ``noise``
    (a deterministic pattern of ``amount`` pixels)."""

    def mutate(ep: Any) -> str | None:
        q = _grid_quantize(ep)
        sampler = _sampler(ep)
        if q is None or sampler is None:
            return None
        source = q.args[0]
        image = sampler.args[0].meta.get("val")
        if not isinstance(source, torch.fx.Node) or not isinstance(image, torch.Tensor):
            return None
        width = int(image.shape[-1])
        graph = ep.graph
        with graph.inserting_before(q):
            if kind == "zoom":
                new = graph.call_function(exir_ops.edge.aten.mul.Scalar, (source, amount))
            elif kind == "shift":
                new = graph.call_function(
                    exir_ops.edge.aten.add.Scalar, (source, amount * 2 / width)
                )
            else:
                wave = graph.call_function(exir_ops.edge.aten.mul.Scalar, (source, 997.0))
                sine = graph.call_function(exir_ops.edge.aten.sin.default, (wave,))
                bump = graph.call_function(
                    exir_ops.edge.aten.mul.Scalar, (sine, amount * 2 / width)
                )
                for n in (wave, sine, bump):
                    n.meta = dict(source.meta)
                new = graph.call_function(exir_ops.edge.aten.add.Tensor, (source, bump))
        new.meta = dict(source.meta)
        q.args = (new, *q.args[1:])
        return f"grid {kind} {amount:g}"

    return mutate


def sampler_argument(index: int, value: Callable[[Any], Any], what: str) -> Mutation:
    def mutate(ep: Any) -> str | None:
        sampler = _sampler(ep)
        if sampler is None:
            return None
        args = list(sampler.args)
        args[index] = value(args[index])
        sampler.args = tuple(args)
        return what

    return mutate


def residual(kind: str) -> Mutation:
    """The last two-tensor add dropped to its first operand, or its second operand added twice."""

    def mutate(ep: Any) -> str | None:
        adds = [
            n
            for n in _calls(ep, "aten.add.Tensor")
            if all(_is(a, "dequantize") for a in n.args[:2])
        ]
        if not adds:
            return None
        add = adds[-1]
        if kind == "drop":
            add.replace_all_uses_with(add.args[0])  # type: ignore[arg-type]
            ep.graph.erase_node(add)
            return f"{add.name} dropped"
        twice = _insert_after(ep, add, exir_ops.edge.aten.add.Tensor, add.args[1])
        return f"{add.name}'s second operand added twice ({twice.name})"

    return mutate


def drop_activation(ep: Any) -> str | None:
    for name in ("aten.relu", "aten.tanh", "aten.clamp"):
        nodes = _calls(ep, name)
        if nodes:
            node = nodes[0]
            node.replace_all_uses_with(node.args[0])  # type: ignore[arg-type]
            ep.graph.erase_node(node)
            return f"{node.name} dropped"
    return None


def output_rounding(kind: str) -> Mutation:
    """The last quantize before the output: ``truncate`` (half a step down before rounding:
    floor), ``offset`` (its dequantize reads one step up)."""

    def mutate(ep: Any) -> str | None:
        output = next(n for n in ep.graph.nodes if n.op == "output")
        leaves = [
            a
            for a in torch.utils._pytree.tree_leaves(output.args[0])
            if isinstance(a, torch.fx.Node)
        ]
        for leaf in leaves:
            dq = leaf if _is(leaf, "dequantize") else None
            q = (
                dq.args[0]
                if dq is not None
                else (leaf if _is(leaf, "quantize_per_tensor") else None)
            )
            if not isinstance(q, torch.fx.Node) or not _is(q, "quantize_per_tensor"):
                continue
            if kind == "clamp":  # the clamp that feeds the output's quantize, 3 steps narrower
                clamp = q.args[0]
                if not (_is(clamp, "clamp") or _is(clamp, "hardtanh")):
                    continue
                low, high = clamp.args[1], clamp.args[2]
                if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
                    continue
                step = float(q.args[1])
                clamp.args = (clamp.args[0], float(low) + 3 * step, float(high) - 3 * step)
                return "the output's clamp 3 steps narrower at both ends (+-124 of +-127)"
            if kind == "offset" and dq is not None:
                dq.args = (dq.args[0], dq.args[1], int(dq.args[2]) - 1, *dq.args[3:])
                return "the output's dequantize one step up"
            if kind == "truncate":
                source = q.args[0]
                with ep.graph.inserting_before(q):
                    new = ep.graph.call_function(
                        exir_ops.edge.aten.sub.Scalar, (source, 0.5 * float(q.args[1]))
                    )
                new.meta = dict(source.meta)
                q.args = (new, *q.args[1:])
                return "the output truncated (half a step down, then rounded)"
        return None

    return mutate


MUTATIONS: dict[str, Mutation] = {
    "coordinate-bias-55-steps": coordinate_bias(55),
    "coordinate-bias-8-steps": coordinate_bias(8),
    "bias-truncation": bias_everywhere(-0.5),
    "bias-one-step": bias_everywhere(1.0),
    "weight-scale-one-channel-10pct": weight_scale(1.10, True),
    "weight-scale-all-3pct": weight_scale(1.03, False),
    "channel-flip": sampled_image("flip"),
    "shift-x-1px": sampled_image("shift", 3),
    "shift-y-1px": sampled_image("shift", 2),
    "flow-components-swapped": flow_component_swap,
    "grid-zoom-w-over-w-1": lambda ep: None,  # set per model below (needs W)
    "grid-shift-0.13px": grid_math("shift", 0.13),
    "grid-shift-0.5px": grid_math("shift", 0.5),
    "grid-noise-2px": grid_math("noise", 2.0),
    "sampler-nearest": sampler_argument(2, lambda m: 1 if m == 0 else 0, "sampler mode swapped"),
    "sampler-padding": sampler_argument(3, lambda p: 1 if p == 0 else 0, "padding mode swapped"),
    "sampler-corners": sampler_argument(4, lambda a: not a, "align_corners flipped"),
    "residual-dropped": residual("drop"),
    "residual-duplicated": residual("twice"),
    "activation-dropped": drop_activation,
    "output-truncated": output_rounding("truncate"),
    "output-offset-one-step": output_rounding("offset"),
    "output-clamp-124": output_rounding("clamp"),
}


def grid_zoom(ep: Any) -> str | None:
    sampler = _sampler(ep)
    image = sampler.args[0].meta.get("val") if sampler is not None else None
    if not isinstance(image, torch.Tensor):
        return None
    width = int(image.shape[-1])
    return grid_math("zoom", width / (width - 1))(ep)


MUTATIONS["grid-zoom-w-over-w-1"] = grid_zoom


# -- running one ---------------------------------------------------------------------------------


@contextmanager
def mutated(mutation: Mutation, fired: list[str]) -> Iterator[None]:
    """Exports inside this block get ``mutation`` applied to the edge program at its first
    ``to_backend`` (after the ETRecord copied its reference graph, before any partitioner);
    what it did is appended to ``fired``."""
    from executorch.exir.program._program import EdgeProgramManager

    original = EdgeProgramManager.to_backend

    def to_backend(self: Any, partitioner: Any) -> Any:
        if not fired:
            program = self.exported_program()
            what = mutation(program)
            if what is not None:
                program.graph.eliminate_dead_code()
                program.graph.lint()
                program.graph_module.recompile()
                fired.append(what)
            else:
                fired.append("")
        return original(self, partitioner)

    EdgeProgramManager.to_backend = to_backend  # type: ignore[method-assign]
    try:
        yield
    finally:
        EdgeProgramManager.to_backend = original  # type: ignore[method-assign]


@contextmanager
def observed_runs(into: dict[str, Any]) -> Iterator[None]:
    """Records the program's raw outputs and the quantized model's outputs of each verified
    run (``check.verify.verify_run``)."""
    import etkit_exporter.check.verify as verify

    original = verify.verify_run

    def spy(
        pte: Any, model: Any, quantized: Any, inputs: Any, io: Any, *args: Any, **kwargs: Any
    ) -> Any:
        from etkit_exporter.core.io_params import float_output

        run = original(pte, model, quantized, inputs, io, *args, **kwargs)
        with torch.no_grad():
            reference = quantized(*inputs)
        # as the program's user reads them: dequantized with its io_quant_params.json
        into["program"] = [
            float_output(t.clone(), e) for t, e in zip(run.outputs, io["outputs"], strict=True)
        ]
        into["steps"] = [e.get("scale") or 1.0 for e in io["outputs"]]
        into["reference"] = [t.clone() for t in torch.utils._pytree.tree_leaves(reference)]
        into["verdict"] = run.verification.get("verdict")
        into["verification"] = run.verification  # verify_export completes it after this run
        into["quantized_model"], into["io"] = quantized, io
        return run

    verify.verify_run = spy  # type: ignore[assignment]
    try:
        yield
    finally:
        verify.verify_run = original  # type: ignore[assignment]


@dataclass
class Outcome:
    """One mutation on one model and target."""

    mutation: str
    applied: str | None  # what it changed; None: it does not apply to this model
    fired: bool  # the program's outputs differ from the clean program's
    references_unchanged: bool
    caught: bool
    size: float  # the change's error power over the envelope's bound (> 1: above it)
    bias: float  # the change's mean over the envelope's bound on the mean
    reasons: list[str]
    error: str | None = None
    seen: dict[str, Any] = field(default_factory=dict, repr=False)  # the observed run


def export_verified(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: Path, target: str, **options: Any
) -> tuple[dict[str, Any], BaseException | None]:
    """Exports with ``verify=True``; returns the observed run and the verification error, if
    any (a mutated export that fails lowering is an error too)."""
    from etkit_exporter.export.pipeline import export_model

    seen: dict[str, Any] = {}
    with observed_runs(seen):
        try:
            export_model(
                model, inputs, artifacts_root=out, target=target, verify=True, force=True, **options
            )
        except Exception as error:
            return seen, error
    return seen, None


def run_mutation(
    name: str,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    clean: dict[str, Any],
    out: Path,
    target: str,
    **options: Any,
) -> Outcome:
    """Exports ``model`` with mutation ``name`` and judges it against the ``clean`` export's
    observed run (``export_verified``)."""
    from etkit_exporter.check.verdict import VerificationError

    fired: list[str] = []
    with mutated(MUTATIONS[name], fired):
        seen, error = export_verified(model, inputs, out, target, **options)
    applied = fired[0] if fired and fired[0] else None
    if applied is None:
        return Outcome(name, None, False, True, False, 0.0, 0.0, [])
    if "program" not in seen:
        text = str(error).splitlines()[0] if error is not None else "no verified run"
        return Outcome(name, applied, False, True, False, 0.0, 0.0, [], error=text)
    changed = any(
        not torch.equal(a, b) for a, b in zip(seen["program"], clean["program"], strict=True)
    )
    same_references = all(
        torch.equal(a, b) for a, b in zip(seen["reference"], clean["reference"], strict=True)
    )
    caught = isinstance(error, VerificationError)
    size, bias = _size(seen, clean)
    verdict = seen.get("verdict") or {}
    reasons = [r for o in verdict.get("outputs", []) for r in o.get("reasons", [])]
    reasons += [r for c in verdict.get("coordinates", []) for r in c.get("reasons", [])]
    other = None if error is None or caught else str(error).splitlines()[0]
    return Outcome(
        name, applied, changed, same_references, caught, size, bias, reasons, other, seen
    )


def _size(seen: dict[str, Any], clean: dict[str, Any]) -> tuple[float, float]:
    """How large the change is against the rounding envelope, from the clean program (not the
    PT2E model the verdict compares with): over outputs, the largest of its error power (the
    mutated program against the clean one, in output steps) over the envelope's bound on power,
    and of its mean over the envelope's bound on the mean. Above 1: larger than the envelope."""
    verdict = clean.get("verdict") or {}
    outputs = verdict.get("outputs", [])
    worst, bias = 0.0, 0.0
    for k, (a, b) in enumerate(zip(seen["program"], clean["program"], strict=True)):
        difference = (a.double() - b.double()) / clean["steps"][k]
        power, mean = float((difference * difference).mean()), float(difference.mean())
        bounds = outputs[k] if k < len(outputs) else {}
        power_bound = bounds.get("power_bound_steps2")
        bias_bound = bounds.get("bias_bound_steps")
        worst = max(worst, math.inf if not power_bound else power / power_bound)
        bias = max(bias, math.inf if not bias_bound else abs(mean) / bias_bound)
    return worst, bias
