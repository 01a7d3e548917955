"""An export of several sizes (report.json's ``sizes``) in words: the lines ``etkit inspect``
prints and report.md's "Sizes" section."""

from __future__ import annotations

from typing import Any


def size_lines(sizes: dict[str, Any] | None) -> list[str]:
    """The methods and their sizes, or the range the one method takes; the bytes the methods
    cost; the verdict at each size verified; where each other method's ETRecord and Model
    Explorer data lie. Nothing for an export of one size."""
    if not sizes:
        return []
    lines = []
    if "dynamic" in sizes:
        bounds = sizes["dynamic"]
        (h0, h1), (w0, w1), m = bounds["height"], bounds["width"], bounds["multiple"]
        step = f", multiples of {m}" if m != 1 else ""
        lines.append(f"method forward: any size {h0}..{h1} x {w0}..{w1}{step} (example size "
                     f"{sizes.get('example')})")  # fmt: skip
    else:
        methods = sizes.get("methods", {})
        lines.append("methods: " + ", ".join(f"{name} ({size})" for name, size in methods.items()))
    if "bytes" in sizes:
        b = sizes["bytes"]
        lines.append(f"program {b['program']} bytes, {b['ratio_to_largest']}x the largest "
                     f"method exported alone ({b['largest_alone']} bytes)")  # fmt: skip
        if "weights" in b:
            lines.append(f"methods share {b['shared_bytes']} bytes; weights {b['weights']}")
    verified = sizes.get("verified") or []
    if verified:
        lines.append("verified: " + ", ".join(
            f"{e['method']} at {e['size']} {e['result']}" for e in verified
        ))  # fmt: skip
    folders = sorted({r.rsplit("/", 1)[0] for e in verified for r in e.get("records", [])})
    if folders:
        lines.append("each other method's ETRecord and Model Explorer data: " + ", ".join(folders))
    written = sorted({r.rsplit("/", 1)[0] for rs in sizes.get("records", {}).values() for r in rs})
    if written:
        lines.append("each other method's ETRecord: " + ", ".join(written))
    return lines


def sizes_markdown(sizes: dict[str, Any] | None) -> list[str]:
    """report.md's "Sizes" section (nothing for an export of one size): ``size_lines`` and a
    table of every method or size verified, how, and its outputs' figures."""
    if not sizes:
        return []
    lines = ["", "## Sizes", "", *(f"- {line}" for line in size_lines(sizes))]
    verified = sizes.get("verified") or []
    if verified:
        lines += ["", "| method | size | result | how | outputs (PSNR vs PT2E, steps max) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for e in verified:
            outputs = "; ".join(
                f"{'inf' if o.get('psnr_db') is None else format(o['psnr_db'], '.2f')} dB, "
                f"{o.get('max_steps')}"
                for o in e.get("outputs", [])
            )
            lines.append(
                f"| {e['method']} | {e['size']} | {e['result']} | {e['how']} | {outputs} |"
            )
    return lines
