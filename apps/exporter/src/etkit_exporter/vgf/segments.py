"""A VGF's seams (issue 39, item 2): its model sequence's segments by kind, and every value one
segment hands to another (an ``INTERMEDIATE`` resource a segment reads), with its bytes, as
``vgf_dump`` declares them. In etkit's one-VGF programs each grid sampler is a compute segment
between graph segments (model-converter 0.11 cannot put a shader inside a graph segment), so
its image and grid go out of one graph segment and its output into the next: those seams are
the price of the sampler being a shader. A seam into a graph segment that follows a graph
segment would be one the converter made; ``graph_to_graph`` counts them. (``vgf_dump`` gives
the producer's and the consumer's resource of a seam separate indices, so a seam is named by
its consumer and the segment before that consumer in the sequence.)"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Final

from etkit_exporter.vgf.scenario import vgf_declarations

_BITS: Final = re.compile(r"[RGBA](\d+)")


def format_bytes(vk_format: str) -> int:
    """Bytes of one element of a Vulkan format: ``VK_FORMAT_R8_SINT`` 1, ``..._R16G16_...`` 4."""
    channels = vk_format.removeprefix("VK_FORMAT_").split("_", 1)[0]
    bits = sum(int(b) for b in _BITS.findall(channels))
    if not bits:
        raise ValueError(f"not a Vulkan format with channel sizes: {vk_format!r}")
    return bits // 8


def _kind(segment: dict[str, Any]) -> str:
    """A segment's kind as the report names it: ``graph``, ``compute``."""
    return str(segment.get("type", "unknown")).lower()


def seams(declarations: dict[str, Any]) -> dict[str, Any]:
    """``declarations`` (``vgf_dump``'s JSON) summarised: segments by kind; ``seams``, each
    value a segment reads that another segment wrote (an intermediate resource), with its
    consumer, shape and bytes; ``seam_bytes`` their sum per inference; ``graph_to_graph`` the
    seams between two graph segments."""
    resources = {int(r["index"]): r for r in declarations.get("resources", [])}
    segments = declarations.get("model_sequence", {}).get("segments", [])
    kinds = Counter(_kind(s) for s in segments)
    listed: list[dict[str, Any]] = []
    for k, segment in enumerate(segments):
        after = _kind(segments[k - 1]) if k else "inputs"
        for port in segment.get("inputs", []):
            resource = resources.get(int(port["mrt_index"]))
            if resource is None or resource.get("category") != "INTERMEDIATE":
                continue
            shape = [int(d) for d in resource.get("shape", [])]
            listed.append(
                {
                    "into": str(segment.get("name")),
                    "into_kind": _kind(segment),
                    "after_kind": after,
                    "shape": shape,
                    "format": str(resource.get("vk_format")),
                    "bytes": math.prod(shape) * format_bytes(str(resource.get("vk_format"))),
                }
            )
    graph_to_graph = sum(1 for s in listed if s["into_kind"] == s["after_kind"] == "graph")
    return {
        "graph_segments": kinds.get("graph", 0),
        "compute_segments": kinds.get("compute", 0),
        "seams": listed,
        "seam_count": len(listed),
        "seam_bytes": sum(s["bytes"] for s in listed),
        "graph_to_graph": graph_to_graph,
    }


def vgf_seams(blob: bytes, scratch: Path) -> dict[str, Any]:
    """``seams`` of the VGF ``blob`` (a VGF delegate's processed bytes), written to
    ``scratch``/delegate.vgf for ``vgf_dump``."""
    path = scratch / "delegate.vgf"
    path.write_bytes(blob)
    return seams(vgf_declarations(path))
