"""What Model Explorer shows about etkit's delegates, computed from a ``.pte`` read by
``etkit_pterunner`` (no Model Explorer import here).

Node ids follow the upstream ``.pte`` adapter (``pte-adapter-model-explorer``):
``{method}_{chain}_{instruction}`` for the instruction at that position of that chain, so that
node data keyed by them applies to the graph of either adapter."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND
from etkit_gridsampler.delegate_format import DelegateFormatError, decode
from etkit_pterunner import DelegateInfo, Instruction, MethodInfo, TensorInfo, dtype_name

Attribute = tuple[str, str]


def node_id(method: str, chain: int, position: int) -> str:
    """The id the upstream ``.pte`` adapter gives the node of an instruction."""
    return f"{method}_{chain}_{position}"


@dataclass(frozen=True)
class DelegateCallSite:
    """One delegate-call instruction of a method: where it is, its node id, its delegate."""

    method: str
    chain: int
    instruction: Instruction
    delegate: DelegateInfo

    @property
    def node_id(self) -> str:
        return node_id(self.method, self.chain, self.instruction.position)


def delegate_call_sites(method: MethodInfo) -> Iterator[DelegateCallSite]:
    """Every delegate call of ``method``, in chain order."""
    for chain_index, chain in enumerate(method.chains):
        for instruction in chain:
            if instruction.kind == "delegate":
                yield DelegateCallSite(
                    method.name, chain_index, instruction, method.delegates[instruction.delegate]
                )


def _shape(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _tensor(method: MethodInfo, args: tuple[int, ...], position: int) -> TensorInfo | None:
    if 0 <= position < len(args):
        value = method.values[args[position]]
        if isinstance(value, TensorInfo):
            return value
    return None


def scale_text(scale: float) -> str:
    """``repr(scale)``, followed by the fraction it is where it is one with a power-of-two
    numerator (``0.007874015718698502 (1/127)``, ``6.103701889514923e-05 (2/32767)``)."""
    text = repr(scale)
    for numerator in (2**k for k in range(17)):
        denominator = round(numerator / scale)
        if 1 < denominator < 2**24 and float(np.float32(numerator / denominator)) == scale:
            return f"{text} ({numerator}/{denominator})"
    return text


def _printable(value: bytes) -> str | None:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() and len(text) <= 120 else None


def delegate_attributes(method: MethodInfo, site: DelegateCallSite) -> list[Attribute]:
    """The attributes of a delegate call's node: backend id, delegate index and size, compile
    specs whose values are short text, and for the grid-sampler backend its decoded blob
    (``grid_sampler_attributes``)."""
    delegate = site.delegate
    attributes: list[Attribute] = [
        ("backend", delegate.backend_id),
        ("delegate.index", str(delegate.index)),
        ("delegate.size", f"{delegate.size} bytes"),
    ]
    for key, value in delegate.compile_specs:
        text = _printable(value)
        shown = text if text is not None else f"{len(value)} bytes"
        attributes.append((f"compile_spec.{key}", shown))
    if delegate.backend_id == GRID_SAMPLER_BACKEND:
        attributes.extend(grid_sampler_attributes(method, site))
    return attributes


def grid_sampler_attributes(method: MethodInfo, site: DelegateCallSite) -> list[Attribute]:
    """What a grid-sampler delegate computes, from its blob
    (``etkit_gridsampler.delegate_format.decode``): mode, padding mode, align_corners; for the
    image, the grid and the output: dtype, and when quantized scale (``scale_text``), zero point
    and range; the shapes (N x C x H x W image and output, N x Ho x Wo x 2 grid) and, from the
    program's tensors, their dim orders. A blob that does not decode gives ``blob error``
    instead."""

    try:
        blob = decode(site.delegate.processed)
    except DelegateFormatError as error:
        return [("blob error", str(error))]
    op = blob.op
    image_shape = blob.image_shape
    grid_shape = blob.grid_shape
    output_shape = (image_shape[0], image_shape[1], grid_shape[1], grid_shape[2])
    args = site.instruction.args
    tensors = {
        "image": _tensor(method, args, blob.roles.image),
        "grid": _tensor(method, args, blob.roles.grid),
        "output": _tensor(method, args, blob.roles.inputs),
    }
    attributes: list[Attribute] = [
        ("mode", op.mode),
        ("padding_mode", op.padding_mode),
        ("align_corners", str(op.align_corners)),
    ]
    for role, qparams, shape in (
        ("image", op.image, image_shape),
        ("grid", op.grid, grid_shape),
        ("output", op.output, output_shape),
    ):
        if qparams is None:
            attributes.append((f"{role}.dtype", "float32"))
        else:
            attributes += [
                (f"{role}.dtype", dtype_name(qparams.dtype)),
                (f"{role}.scale", scale_text(qparams.scale)),
                (f"{role}.zero_point", str(qparams.zero_point)),
                (f"{role}.range", f"[{qparams.quant_min}, {qparams.quant_max}]"),
            ]
        attributes.append((f"{role}.shape", _shape(shape)))
        tensor = tensors[role]
        if tensor is not None:
            attributes.append((f"{role}.dim_order", _shape(tensor.dim_order)))
    return attributes


def method_delegate_attributes(method: MethodInfo) -> dict[str, list[Attribute]]:
    """Node id -> attributes, for every delegate call of ``method``."""
    return {site.node_id: delegate_attributes(method, site) for site in delegate_call_sites(method)}
