"""``pad_rgb_to_rgba``: 3-channel images that grid samplers read become 4-channel (RGBA), so a
GPU can alias them as RGBA textures."""

from __future__ import annotations

import logging

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from etkit_quant.graph import is_grid_sampler

logger = logging.getLogger(__name__)


def _fake(node: Node) -> torch.Tensor | None:
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def pad_rgb_to_rgba(graph_module: GraphModule) -> PassResult:
    """On the ATen graph of ``torch.export`` (before quantization): every 3-channel image input
    of a grid sampler is padded to 4 channels with a zero channel, and the sampler's output is
    sliced back to 3 channels. Sampling a zero channel and slicing it off leaves the other
    channels as they were, so the model's outputs are bit-identical. An image feeding several
    grid samplers is padded once; 4-channel images are untouched; any batch size; running it
    twice changes nothing the second time.

    Raises ``ValueError`` for a graph without tensor metadata on the grid samplers' images (not
    produced by ``torch.export``)."""
    graph = graph_module.graph
    padded: dict[Node, Node] = {}
    changed = False
    for node in list(graph.nodes):
        if not is_grid_sampler(node):
            continue
        image = node.args[0]
        if not isinstance(image, Node):
            continue
        value = _fake(image)
        if value is None:
            raise ValueError(
                f"grid sampler {node.name}: its image has no tensor metadata; run the pass on "
                "the graph of torch.export"
            )
        if value.dim() != 4 or value.shape[1] != 3:
            continue
        if image not in padded:
            with graph.inserting_after(image):
                pad = graph.call_function(
                    torch.ops.aten.constant_pad_nd.default, (image, [0, 0, 0, 0, 0, 1], 0.0)
                )
            pad.meta["val"] = torch.ops.aten.constant_pad_nd.default(value, [0, 0, 0, 0, 0, 1], 0.0)
            padded[image] = pad
        node.replace_input_with(image, padded[image])
        sampled = _fake(node)
        with graph.inserting_after(node):
            rgb = graph.call_function(torch.ops.aten.slice.Tensor, (node, 1, 0, 3))
        for user in [u for u in node.users if u is not rgb]:
            user.replace_input_with(node, rgb)
        if sampled is not None:
            node.meta["val"] = _padded_output(sampled)
            rgb.meta["val"] = sampled
        changed = True
        logger.debug("grid sampler %s: image %s padded to RGBA", node.name, image.name)
    if changed:
        graph.lint()
        graph_module.recompile()
    return PassResult(graph_module, changed)


def _padded_output(sampled: torch.Tensor) -> torch.Tensor:
    """The fake output of a grid sampler that now reads 4 channels."""
    shape = list(sampled.shape)
    shape[1] = 4
    return sampled.new_empty(shape)
