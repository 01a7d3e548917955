"""etkit-layout and etkit-partition on the VGF backend: a quantized flow-warp model (RGB frames,
grid computed in the model, int16 grid, int8 SNORM IO) lowers with no transpose at its image
boundaries, hands its grid sampler to etkit's backend, and keeps integer IO; a channels-last
program computes on Vulkan exactly what the contiguous one does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.passes.quantize_io_pass import extract_io_quant_params
from quant_models import FlowWarp

from etkit_exporter.vgf.scenario import run_vgf, vgf_delegates
from etkit_exporter.vgf.tosa import tosa_op_counts
from etkit_gridsampler import GridSamplerPartitioner
from etkit_layout import channels_last, pad_rgb_to_rgba
from etkit_partition import DetagInputQuantize, DetagOps, DetagOutputDequantize, PolicyPartitioner
from etkit_quant import (
    BoundaryQuantizer,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    quantize,
    snorm8,
    target_name,
)

SPEC = "TOSA-1.0+INT+FP+int16"


def _transposes(folder: Path) -> int:
    counts: Counter[str] = Counter()
    for path in folder.glob("*.tosa"):
        counts += tosa_op_counts(path)
    return counts["TRANSPOSE"]


def _lower_flow_warp(folder: Path, with_layout: bool) -> object:
    torch.manual_seed(0)
    inputs = (torch.rand(1, 3, 16, 16) * 2 - 1, torch.rand(1, 3, 16, 16) * 2 - 1)
    spec = VgfCompileSpec(SPEC)
    spec.dump_intermediate_artifacts_to(str(folder))
    base = VgfQuantizer(spec)
    base.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(FlowWarp().eval(), inputs, strict=True).module(check_guards=False)
    if with_layout:
        pad_rgb_to_rgba(graph)
    quantizer = BoundaryQuantizer(
        base, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),)
    )
    converted = quantize(graph, inputs, quantizer)
    policies = PolicyPartitioner(
        VgfPartitioner(spec),
        [
            DetagInputQuantize(),
            DetagOutputDequantize(),
            DetagOps([torch.ops.aten.grid_sampler_2d.default]),
        ],
    )
    return to_edge_transform_and_lower(
        torch.export.export(converted, inputs, strict=True),
        partitioner=[policies],
        transform_passes=[channels_last] if with_layout else [],
    )


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, Path]:
    with_layout = tmp_path_factory.mktemp("with-layout")
    without = tmp_path_factory.mktemp("without-layout")
    _lower_flow_warp(without, with_layout=False)
    return _lower_flow_warp(with_layout, with_layout=True), with_layout, without


def test_no_transpose_at_image_boundaries(lowered: tuple[object, Path, Path]) -> None:
    _, with_layout, without = lowered
    assert _transposes(without) > 0
    assert _transposes(with_layout) == 0


def test_grid_sampler_left_for_etkit_and_io_integer(lowered: tuple[object, Path, Path]) -> None:
    manager, _, _ = lowered
    program = manager.exported_program()  # type: ignore[attr-defined]
    for delegate in (
        getattr(program.graph_module, str(n.target))
        for n in program.graph.nodes
        if n.op == "get_attr" and str(n.target).startswith("lowered_module")
    ):
        graph = delegate.original_module.graph
        assert not any("grid_sampler" in target_name(n) for n in graph.nodes)
    (sampler,) = [n for n in program.graph.nodes if is_grid_sampler(n)]
    assert is_dequantize(sampler.args[0]) and is_dequantize(sampler.args[1])
    assert sampler.args[1].args[5] == torch.int16  # the int16 grid
    assert sampler.args[0].meta["val"].shape[1] == 4  # RGBA
    assert all(is_quantize(u) for u in sampler.users)
    manager = manager.to_backend(GridSamplerPartitioner())  # type: ignore[attr-defined]
    params = extract_io_quant_params(manager, input_idxs=(0, 1), output_idxs=(0,))
    snorm = {
        "scale": float(torch.tensor(1 / 127)),
        "zero_point": 0,
        "quant_min": -127,
        "quant_max": 127,
    }
    for entry in (*params["inputs"].values(), *params["outputs"].values()):
        assert {k: entry[k] for k in snorm} == snorm
    placeholders = [n for n in manager.exported_program().graph.nodes if n.op == "placeholder"]
    assert all(not is_quantize(u) for p in placeholders for u in p.users)


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(image)))


def test_channels_last_program_computes_the_same_on_vulkan(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.rand(1, 4, 12, 10) * 2 - 1
    model = ConvNet().eval()
    outputs = []
    for with_layout in (False, True):
        folder = tmp_path / str(with_layout)
        spec = VgfCompileSpec("TOSA-1.0+FP")
        spec.dump_intermediate_artifacts_to(str(folder))
        lowered = to_edge_transform_and_lower(
            torch.export.export(model, (x,), strict=True),
            partitioner=[VgfPartitioner(spec)],
            transform_passes=[channels_last] if with_layout else [],
        )
        (vgf,) = vgf_delegates(lowered.exported_program())
        data = x.permute(0, 2, 3, 1).numpy() if with_layout else x.numpy()  # NHWC in memory
        (y,) = run_vgf(vgf, [np.ascontiguousarray(data)])
        outputs.append(
            torch.from_numpy(y).permute(0, 3, 1, 2) if with_layout else torch.from_numpy(y)
        )
        assert (_transposes(folder) == 0) == with_layout
    assert torch.equal(outputs[0], outputs[1])
