"""How much rounding the tensors entering the coordinate arithmetic (a predicted flow, a theta)
to int8 moves the sampling positions (``coordinate_position_error``), against
``POSITION_TOLERANCE_PX``: past it, int16 is called for where the backend has int16
activations. The positions are the grid samplers' grids and the positions index gathers round
to pixels (``gather_positions.rounded_positions``: a warp written as gathers)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import torch
from torch.fx import GraphModule, Interpreter, Node

from etkit_quant.gather_positions import gather_position_nodes, rounded_positions
from etkit_quant.graph import coordinate_inputs, coordinate_nodes, is_grid_sampler
from etkit_quant.ranges import _as_graph_module
from etkit_quant.samples import _check_sample, _materialize

POSITION_TOLERANCE_PX: Final = 1 / 32
"""The largest shift of a sampling position, in pixels of the sampled image, that rounding the
tensors entering the coordinate arithmetic to int8 may cause before int16 is called for
(where the backend has int16 activations)."""


class _PerturbingInterpreter(Interpreter):
    """Runs the graph, rounding the values of ``rounded`` (node -> (scale, zero point, qmin,
    qmax)) as a quantize-dequantize would, recording min/max of ``watched``, every grid
    sampler's grid and the values of ``pixels`` (positions in pixels)."""

    def __init__(
        self,
        module: GraphModule,
        rounded: dict[Node, tuple[float, float, int, int]],
        watched: set[Node],
        pixels: frozenset[Node] = frozenset(),
    ) -> None:
        super().__init__(module)
        self.rounded, self.watched, self.pixels = rounded, watched, pixels
        self.ranges: dict[Node, tuple[float, float]] = {}
        self.grids: list[tuple[Node, torch.Tensor, tuple[int, int], bool]] = []
        self.positions: list[torch.Tensor] = []

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if is_grid_sampler(n) and len(n.args) > 1 and isinstance(n.args[1], Node):
            image, grid = self.env[n.args[0]], self.env[n.args[1]]  # type: ignore[index]
            corners = bool(n.args[4]) if len(n.args) > 4 else False
            size = (int(image.shape[-2]), int(image.shape[-1]))
            self.grids.append((n, grid.detach().clone(), size, corners))
        if n in self.watched and isinstance(result, torch.Tensor):
            low, high = (float(v) for v in torch.aminmax(result.detach().float()))
            old = self.ranges.get(n, (low, high))
            self.ranges[n] = (min(old[0], low), max(old[1], high))
        if n in self.pixels and isinstance(result, torch.Tensor):
            self.positions.append(result.detach().float().clone())
        if n in self.rounded and isinstance(result, torch.Tensor):
            scale, zero, qmin, qmax = self.rounded[n]
            q = torch.clamp(torch.round(result / scale) + zero, qmin, qmax)
            result = (q - zero) * scale
        return result


def coordinate_position_error(
    model: torch.nn.Module | torch.export.ExportedProgram,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    *,
    bits: int = 8,
) -> float:
    """The largest shift of any grid sampler's sampling position, in pixels of its image, or of
    any position an index gather rounds to pixels (``rounded_positions``), over the calibration
    samples, when every tensor entering the coordinate arithmetic or the gathers' positions
    (``graph.coordinate_inputs``, graph inputs left out: they are quantized as grids) is
    rounded to ``bits``-bit integers with the per-tensor parameters a min/max observer would
    choose over the samples (``observed_int8``, or ``observed_int16`` for 16). 0 when nothing
    enters (a grid given as input, or no grid sampler)."""
    given = _materialize(calibration)
    first = _check_sample(given[0], None, "calibration sample 0")
    graph_module = _as_graph_module(model, first)
    samples = [_check_sample(s, None, f"calibration sample {k}") for k, s in enumerate(given)]
    gathers = gather_position_nodes(graph_module)
    region = coordinate_nodes(graph_module) | gathers
    entering = {n for n in coordinate_inputs(graph_module, region) if n.op == "call_function"}
    if not entering:
        return 0.0
    pixels = frozenset(rounded_positions(graph_module, gathers))
    observer = _PerturbingInterpreter(graph_module, {}, entering, pixels)
    clean: list[list[torch.Tensor]] = []
    clean_pixels: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for sample in samples:
            observer.grids, observer.positions = [], []
            observer.run(*sample)
            clean.append([grid for _, grid, _, _ in observer.grids])
            clean_pixels.append(observer.positions)
    qmax = 2 ** (bits - 1) - 1
    rounded = {}
    for node, (low, high) in observer.ranges.items():
        low, high = min(low, 0.0), max(high, 0.0)
        scale = max((high - low) / (2 * qmax), 1e-12) if bits == 8 else max(-low, high) / qmax
        zero = round(-qmax - low / scale) if bits == 8 else 0
        rounded[node] = (scale or 1e-12, float(zero), -qmax, qmax)
    perturbed = _PerturbingInterpreter(graph_module, rounded, set(), pixels)
    worst = 0.0
    with torch.no_grad():
        for sample, grids, positions in zip(samples, clean, clean_pixels, strict=True):
            perturbed.grids, perturbed.positions = [], []
            perturbed.run(*sample)
            for moved, reference in zip(perturbed.positions, positions, strict=True):
                if moved.numel():
                    worst = max(worst, float((moved - reference).abs().amax()))
            for (_, grid, (height, width), corners), reference in zip(
                perturbed.grids, grids, strict=True
            ):
                span = torch.tensor(
                    [width - 1 if corners else width, height - 1 if corners else height]
                )
                shift = ((grid - reference).abs() * span / 2).amax()
                worst = max(worst, float(shift))
    return worst
