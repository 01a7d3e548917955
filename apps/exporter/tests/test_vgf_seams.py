"""A VGF's seams from vgf_dump's declarations (etkit_exporter.vgf.segments)."""

from __future__ import annotations

from typing import Any

import pytest

from etkit_exporter.vgf.segments import format_bytes, seams


def _declarations(kinds: list[str], reads: list[list[tuple[str, list[int], str]]]) -> Any:
    """Segments of ``kinds``; segment k reads ``reads[k]``: (category, shape, format) each."""
    resources: list[dict[str, Any]] = []
    segments = []
    for k, (kind, inputs) in enumerate(zip(kinds, reads, strict=True)):
        ports = []
        for category, shape, vk_format in inputs:
            resources.append(
                {"index": len(resources), "category": category, "shape": shape,
                 "vk_format": vk_format}
            )  # fmt: skip
            ports.append({"mrt_index": len(resources) - 1})
        segments.append({"name": f"{kind.lower()}_segment_{k}", "type": kind, "inputs": ports})
    return {"resources": resources, "model_sequence": {"segments": segments}}


def test_format_bytes() -> None:
    assert format_bytes("VK_FORMAT_R8_SINT") == 1
    assert format_bytes("VK_FORMAT_R16_SINT") == 2
    assert format_bytes("VK_FORMAT_R32_SFLOAT") == 4
    assert format_bytes("VK_FORMAT_R16G16_SINT") == 4
    with pytest.raises(ValueError, match="not a Vulkan format"):
        format_bytes("VK_FORMAT_UNDEFINED")


def test_a_sampler_between_two_graph_segments() -> None:
    image = ("INTERMEDIATE", [1, 5, 7, 4], "VK_FORMAT_R8_SINT")
    grid = ("INTERMEDIATE", [1, 5, 7, 2], "VK_FORMAT_R16_SINT")
    declared = _declarations(
        ["GRAPH", "COMPUTE", "GRAPH"],
        [[("INPUT", [1, 5, 7, 3], "VK_FORMAT_R8_SINT")], [image, grid], [image]],
    )
    found = seams(declared)
    assert (found["graph_segments"], found["compute_segments"]) == (2, 1)
    assert found["seam_count"] == 3 and found["graph_to_graph"] == 0
    assert found["seam_bytes"] == 140 + 140 + 140  # program inputs are not seams
    assert [(s["into_kind"], s["after_kind"]) for s in found["seams"]] == [
        ("compute", "graph"), ("compute", "graph"), ("graph", "compute"),
    ]  # fmt: skip


def test_a_split_between_two_graph_segments_is_counted() -> None:
    value = ("INTERMEDIATE", [1, 16, 8, 8], "VK_FORMAT_R8_SINT")
    declared = _declarations(["GRAPH", "GRAPH"], [[], [value, value]])
    found = seams(declared)
    assert found["graph_to_graph"] == 2 and found["seam_bytes"] == 2 * 1024
