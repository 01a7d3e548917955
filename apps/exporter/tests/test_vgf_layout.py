"""Layouts across the delegates of the demos' VGF exports: every tensor a VGF or grid-sampler
delegate reads or writes has, in the .pte, the dim order the delegate was compiled for, so the
program run whole (VGF on lavapipe, grid samplers on the CPU kernel) matches the converted PT2E
model; image IO and grid-sampler images are channels-last with no layout copy at any boundary,
and io_quant_params.json reports the .pte's dim orders."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import torch

from etkit_exporter import ExportResult, export_model
from etkit_exporter.core.io_params import pte_io_layouts, with_pte_layouts
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.programs import load_program
from etkit_layout import delegate_layout_mismatches
from etkit_pterunner import TensorInfo

NHWC = [0, 2, 3, 1]
NCHW = [0, 1, 2, 3]
_DTYPES = {"int8": torch.int8, "int16": torch.int16}
_EXPORTS: dict[str, ExportResult] = {}


@pytest.fixture(scope="module")
def vgf_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A demo's VGF export: by default its samplers compute segments inside the one VGF;
    ``split`` keeps them in etkit's own delegate (VGF, sampler and VGF delegates)."""

    def get(name: str, split: bool = False) -> ExportResult:
        key = f"{name}-split" if split else name
        if key not in _EXPORTS:
            model, inputs = DEMOS[name]()
            root = tmp_path_factory.mktemp("vgf-layout") / key
            _EXPORTS[key] = export_model(
                model, inputs, artifacts_root=root, target="vgf", sampler_delegate=split
            )
        return _EXPORTS[key]

    return get


def _quantized(x: torch.Tensor, entry: dict[str, Any]) -> torch.Tensor:
    """An input as the program takes it: quantized as io_quant_params says, laid out in its
    dim order."""
    q = torch.round(x / entry["scale"]) + entry["zero_point"]
    value = q.clamp(entry["quant_min"], entry["quant_max"]).to(_DTYPES[entry["dtype"]])
    laid_out: torch.Tensor = value.permute(entry["dim_order"]).contiguous()
    return laid_out.permute(_inverse(entry["dim_order"]))


def _inverse(order: list[int]) -> list[int]:
    return [order.index(d) for d in range(len(order))]


def _int_steps(y: torch.Tensor, reference: torch.Tensor, entry: dict[str, Any]) -> int:
    """Largest difference, in integer steps, from the reference quantized to the output's qspec
    (the reference is the converted model's output: dequantized integers)."""
    expected = torch.round(reference / entry["scale"]) + entry["zero_point"]
    return int((y.to(torch.int32) - expected.to(torch.int32)).abs().max())


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("flow-warp", False),
        ("stn", False),
        ("resample", False),
        # the split path on demand (-m extended): CI's in test_real_models' vgf-split subset
        pytest.param("flow-warp", True, marks=pytest.mark.extended),
    ],
)
def test_vgf_export_layouts_agree_and_outputs_match(
    vgf_export: Any, name: str, split: bool
) -> None:
    export = vgf_export(name, split)
    io = json.loads((export.artifacts_root / "io_quant_params.json").read_text())
    assert io == export.io_quant_params
    pte = export.pte_path.read_bytes()
    # io_quant_params.json reports the .pte's dim orders (read by ExecuTorch's deserializer and
    # by the runner's own reader)
    layouts = pte_io_layouts(pte)
    program = load_program(export.pte_path)
    method = program.method()
    for kind, infos in (("inputs", method.input_infos), ("outputs", method.output_infos)):
        assert all(isinstance(i, TensorInfo) for i in infos)
        found = [x["dim_order"] if x is not None else None for x in layouts[kind]]
        assert [e["dim_order"] for e in io[kind]] == found
        assert found == [list(i.dim_order) for i in infos if isinstance(i, TensorInfo)]
        # design.md: image IO channels-last, grids N x H x W x 2 as they are
        for entry in io[kind]:
            grid = entry["shape"][-1] == 2
            assert entry["dim_order"] == (NCHW if grid else NHWC), entry
    # Every delegate boundary in the final program has the layout its delegate was compiled
    # for, and none needed a layout copy.
    assert delegate_layout_mismatches(export.edge_program) == []
    assert not [op for op in method.operators if "dim_order" in op]
    # Run whole: VGF delegates on lavapipe (samplers inside as compute segments), or, split,
    # the grid-sampler delegates on the CPU kernel between them.
    inputs = [_quantized(x, e) for x, e in zip(export.example_inputs, io["inputs"], strict=True)]
    result = program.run(inputs)
    backends = [c.backend_id for c in result.delegate_calls]
    if split:
        assert set(backends) == {"VgfBackend", "GridSamplerBackend"}, backends
    else:  # inside the VGF, or in etkit's delegate where the report says so (with why)
        paths = export.report["grid_sampler_paths"]
        own = {"GridSamplerBackend"} if any(p["path"] == "etkit-delegate" for p in paths) else set()
        assert set(backends) == {"VgfBackend"} | own, (backends, paths)
    assert result.warnings == []  # no VGF declares a layout other than the program's
    assert export.converted_model is not None
    with torch.no_grad():
        references = export.converted_model(*export.example_inputs)
    if isinstance(references, torch.Tensor):
        references = (references,)
    for actual, reference, entry in zip(result.outputs, references, io["outputs"], strict=True):
        assert actual.dtype == torch.int8
        assert list(actual.shape) == entry["shape"]
        assert _int_steps(actual, reference, entry) <= 1


def test_with_pte_layouts_reports_the_serialized_dim_orders(
    vgf_export: Any, caplog: pytest.LogCaptureFixture
) -> None:
    export = vgf_export("stn")
    pte = export.pte_path.read_bytes()
    table = export.io_quant_params
    assert with_pte_layouts(table, pte) == table
    wrong = json.loads(json.dumps(table))
    wrong["outputs"][0]["dim_order"] = NCHW
    with caplog.at_level(logging.WARNING, logger="etkit_exporter.core.io_params"):
        fixed = with_pte_layouts(wrong, pte)
    assert fixed == table and wrong["outputs"][0]["dim_order"] == NCHW
    assert "the serialized program has [0, 2, 3, 1]" in caplog.text
    wrong["outputs"][0]["shape"] = [1, 4, 16, 64]
    with pytest.raises(ValueError, match=r"output 0 .* is \[1, 4, 32, 32\] in the serialized"):
        with_pte_layouts(wrong, pte)


class _Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_io_table_reads_tensor_specs() -> None:
    """On a program ``to_executorch`` has made specs for, the IO table reports each tensor
    spec's dim order (what is serialized), not the fake tensor's."""
    from executorch.exir.tensor import TensorSpec

    from etkit_exporter.core.io_params import io_table
    from etkit_partition import user_output_nodes

    program = torch.export.export(_Scale(), (torch.rand(1, 4, 8, 8),), strict=True)
    (output,) = user_output_nodes(program)
    nhwc = output.meta["val"].contiguous(memory_format=torch.channels_last)
    output.meta["spec"] = TensorSpec.from_tensor(nhwc)
    table = io_table(program, {"inputs": {}, "outputs": {}})
    assert table["inputs"][0]["dim_order"] == NCHW
    assert table["outputs"][0]["dim_order"] == NHWC
