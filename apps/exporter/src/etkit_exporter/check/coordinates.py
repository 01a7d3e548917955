"""Coordinates judged as coordinates: every tensor a delegate call of the program produces
upstream of a grid sampler's grid (the grid itself, a flow, a theta, the features a flow is
predicted from) is judged by where it makes the sampler sample, in pixels of the image sampled.

For each such tensor, the quantized model is run with that one tensor replaced by the
program's value (everything else its own), and the grid it then gives the sampler is compared
with its own grid: the sampling-position error this tensor causes, per axis,
``(g - g_ref) * (W - 1) / 2`` (``align_corners``) or ``* W / 2`` in x, the same with ``H`` in y.
Two rules, on the unrounded differences:

- bias: a systematic shift of ``coordinate_bias_px`` (1/8 pixel) or more in either axis fails,
  whatever the outputs say (a warp half a pixel off hides below rounding on smooth images);
- spread: the mean square error at most the 99.9 % prediction bound of the rounding envelope's
  (``check.envelope``: the same grid in the quantized model under legitimate rounding).

Tensors inside one delegate (a whole-program VGF computes its grids inside) are not observable
here; such a program's coordinates are judged only through its outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from etkit_exporter.check.envelope import Reducer, prediction_bound

# The spread rule's floor: a grid within this of the quantized model's (pixels, root mean
# square) is rounding whatever the envelope says (an int16 step at 4096 pixels is 1/16 pixel)
_FLOOR_PX = 1.0 / 64


@dataclass(frozen=True)
class SamplerSite:
    """A grid sampler of the reference graph: its node, its grid argument's node, the size of
    the image it samples and whether corners are aligned."""

    node: str
    grid: str
    height: int
    width: int
    align_corners: bool

    def pixels(self, grid: torch.Tensor) -> torch.Tensor:
        """A normalized grid difference (..., 2) in pixels of the sampled image."""
        if self.align_corners:
            x, y = (self.width - 1) / 2, (self.height - 1) / 2
        else:
            x, y = self.width / 2, self.height / 2
        return grid.double() * torch.tensor([x, y], dtype=torch.float64)


def sampler_sites(graph: torch.fx.Graph) -> list[SamplerSite]:
    """Every grid sampler of ``graph`` whose image size is known."""
    sites = []
    for node in graph.nodes:
        if node.op != "call_function" or "grid_sampler" not in str(node.target):
            continue
        image, grid = node.args[0], node.args[1]
        value = image.meta.get("val") if isinstance(image, torch.fx.Node) else None
        if not isinstance(grid, torch.fx.Node) or not isinstance(value, torch.Tensor):
            continue
        align = bool(node.args[4]) if len(node.args) > 4 else False
        height, width = (_size_hint(s) for s in value.shape[-2:])
        sites.append(SamplerSite(node.name, grid.name, height, width, align))
    return sites


def _size_hint(size: Any) -> int:
    """A dimension's size: its value, or for a symbolic one (a range export's graph) the example
    input's, which the reference graph runs on."""
    if isinstance(size, torch.SymInt):
        return int(size.node.hint)
    return int(size)


def coordinate_producers(graph: torch.fx.Graph, sites: list[SamplerSite]) -> dict[str, list[int]]:
    """For each node upstream of a sampler's grid (the grid node included), the indices of the
    sites whose grid it feeds."""
    by_name = {n.name: n for n in graph.nodes}
    feeds: dict[str, list[int]] = {}
    for index, site in enumerate(sites):
        stack, seen = [by_name[site.grid]], set()
        while stack:
            node = stack.pop()
            if node.name in seen:
                continue
            seen.add(node.name)
            feeds.setdefault(node.name, []).append(index)
            stack.extend(n for n in node.all_input_nodes if n.op == "call_function")
    return feeds


def grid_reducer(sites: Sequence[SamplerSite], expected: torch.Tensor) -> Reducer:
    """What an envelope run keeps of a grid ``sites`` sample at (one grid node): per site, its
    mean square sampling-position error against ``expected`` (the quantized model's grid)."""

    def reduce(grid: torch.Tensor) -> dict[str, float]:
        return {site.node: _mean_square(site, grid, expected) for site in sites}

    return reduce


@dataclass
class CoordinateCheck:
    """What the coordinate rule needs of the reference graph: its samplers (``sites``), which
    node feeds which sampler's grid (``producers``), the quantized model's grids, and the graph
    run again with one tensor replaced (``conditional``: name, value -> each site grid's
    value)."""

    sites: list[SamplerSite]
    producers: dict[str, list[int]]
    grids: dict[str, torch.Tensor]
    conditional: Callable[[str, torch.Tensor], Mapping[str, Any]]

    def reducers(self) -> dict[str, Reducer]:
        """The envelope's reducer of each site grid the rule reads."""
        by_grid: dict[str, list[SamplerSite]] = {}
        for site in self.sites:
            if isinstance(self.grids.get(site.grid), torch.Tensor):
                by_grid.setdefault(site.grid, []).append(site)
        return {grid: grid_reducer(sites, self.grids[grid]) for grid, sites in by_grid.items()}


def judge_coordinates(
    observed: Mapping[str, torch.Tensor],
    check: CoordinateCheck,
    spread: Callable[[str], tuple[list[Any], list[Any]]],
    bias_px: float,
    on_tensor: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Each tensor in ``observed`` (a delegate call's output, by the reference graph's node
    name) that feeds a sampler's grid, judged by the sampling positions it causes (module
    docstring): one row per (tensor, sampler) with ``bias_px`` (x, y), ``rms_px``,
    ``rms_bound_px``, ``passes`` and ``reasons``. ``spread(grid)``: the rounding envelope's
    figures of a site grid in its dithered and its mode runs (``CoordinateCheck.reducers``'),
    none for a float export. ``on_tensor(done, total)`` after each tensor."""
    rows: list[dict[str, Any]] = []
    judged = [
        (name, value)
        for name, value in observed.items()
        if check.producers.get(name) and isinstance(value, torch.Tensor)
    ]
    for done, (name, value) in enumerate(judged, 1):
        values = check.conditional(name, value)
        for index in check.producers[name]:
            site = check.sites[index]
            grid, expected = values.get(site.grid), check.grids.get(site.grid)
            if not isinstance(grid, torch.Tensor) or not isinstance(expected, torch.Tensor):
                continue
            if not (grid.dtype.is_floating_point and expected.dtype.is_floating_point):
                continue
            error = site.pixels(grid.reshape(expected.shape) - expected).reshape(-1, 2)
            bias = [float(error[:, 0].mean()), float(error[:, 1].mean())]
            mean_square = float((error * error).sum(dim=1).mean())
            bound = _FLOOR_PX**2
            dithered, modes = spread(site.grid)
            if len(dithered) >= 2:
                runs = [d[site.node] for d in dithered]
                mode_runs = [d[site.node] for d in modes]
                bound = max(bound, prediction_bound(runs), *mode_runs)
            reasons = [
                f"sampling positions shifted {b:+.3g} px in {axis} (less than {bias_px:g} px "
                "either way)"
                for axis, b in zip("xy", bias, strict=True)
                if abs(b) >= bias_px
            ]
            if mean_square > bound:
                reasons.append(
                    f"sampling positions {mean_square**0.5:.3g} px off (root mean square; the "
                    f"rounding envelope allows {bound**0.5:.3g} px)"
                )
            row: dict[str, Any] = {
                "node": name,
                "sampler": site.node,
                "image": [site.height, site.width],
                "bias_px": bias,
                "rms_px": mean_square**0.5,
                "rms_bound_px": bound**0.5,
                "max_px": float(error.norm(dim=1).max()) if error.numel() else 0.0,
                "passes": not reasons,
            }
            if reasons:
                row["reasons"] = reasons
            rows.append(row)
        del values
        if on_tensor is not None:
            on_tensor(done, len(judged))
    return rows


def _mean_square(site: SamplerSite, grid: torch.Tensor, expected: torch.Tensor) -> float:
    """The mean square sampling-position error (pixels^2) of ``grid`` against ``expected``."""
    error = site.pixels(grid.reshape(expected.shape).double() - expected.double())
    return float(error.pow(2).sum(-1).mean())
