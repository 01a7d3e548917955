"""One export for several input sizes (issue 38): an enumerated export of the flow-warp demo, a
method per size in one program, every method verified; a size range on XNNPACK, one method with
dynamic height and width, run at five sizes (three not in any example) and judged against the
quantized model at each; the one-line refusals; the runner's grid sampler at dynamic sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from torch.export import Dim

from etkit_exporter import export_model
from etkit_exporter.artifact.sizes_text import size_lines
from etkit_exporter.check.bundle import compare, read_bundle, run_bundle
from etkit_exporter.check.verify import verify_run
from etkit_exporter.cli.config import read_config, render_config
from etkit_exporter.cli.run import run_export
from etkit_exporter.core.errors import ExportError
from etkit_exporter.export.demos import DEMOS, FlowWarp
from etkit_exporter.export.sizes import (
    SizeError,
    SizeRange,
    check_sizes,
    resize_inputs,
    size_options,
)
from etkit_exporter.programs import program_from_bytes
from etkit_exporter.programs.runtime import runtime_method
from etkit_gridsampler import GridSampleOp, GridSamplerPartitioner, QParams, cpu

pytestmark = pytest.mark.slow

SIZES = [(32, 48), (24, 40), (40, 56)]  # the demo's own 32 x 48 first: forward is that size
RANGE = ((16, 64), (16, 96), 8)


class AnySizeFlowWarp(FlowWarp):
    """The flow-warp demo with its pixel grid computed from the input's size in tensor ops (the
    demo's ``linspace`` fixes the size: ``torch.export`` cannot make it dynamic)."""

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        _, _, height, width = frame0.shape
        flow = torch.tanh(self.flow(torch.cat([frame0, frame1], 1))) * 0.1
        ys = torch.arange(height, dtype=torch.float32) * 2 / (height - 1) - 1
        xs = torch.arange(width, dtype=torch.float32) * 2 / (width - 1) - 1
        grid = torch.stack(
            (
                xs.view(1, 1, -1).expand(1, height, width),
                ys.view(1, -1, 1).expand(1, height, width),
            ),
            -1,
        )
        warped = F.grid_sample(
            frame0, grid + flow.permute(0, 2, 3, 1), padding_mode="border", align_corners=False
        )
        return torch.clamp(self.refine(warped) + warped, -1, 1)


class Pyramid(torch.nn.Module):
    """Takes only even heights and widths: a half-size branch added back after upsampling."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        half = F.avg_pool2d(image, 2)
        return image + F.interpolate(half, scale_factor=2.0, mode="nearest")


def _frames(height: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(1, 3, height, width, generator=generator) * 2 - 1 for _ in range(2))  # type: ignore[return-value]


# calibration samples of a listed size other than the example's; of three sizes of the range
ENUMERATED_CALIBRATION = [_frames(40, 56, 7), _frames(40, 56, 8)]
RANGE_CALIBRATION = [_frames(32, 48, 0), _frames(16, 24, 5), _frames(64, 96, 6)]
FOUR_CHANNELS = (_frames(24, 40, 2)[0], torch.rand(1, 4, 24, 40))  # its second input: 4 channels


@pytest.fixture(scope="module")
def enumerated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, inputs = DEMOS["flow-warp"]()
    root = tmp_path_factory.mktemp("sizes") / "enumerated"
    # calibrated at a listed size that is not the example's: its ranges serve every size
    return export_model(model, inputs, artifacts_root=root, target="xnnpack", sizes=SIZES,
                        calibration=ENUMERATED_CALIBRATION, verify=True, bundle=True)  # fmt: skip


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.manual_seed(0)
    model = AnySizeFlowWarp().eval()
    root = tmp_path_factory.mktemp("sizes") / "range"
    result = export_model(model, _frames(32, 48, 0), artifacts_root=root, target="xnnpack",
                          dynamic_size=RANGE, calibration=RANGE_CALIBRATION, verify=True,
                          bundle=True)  # fmt: skip
    return model, result


def _observed(result: Any, name: str) -> dict[str, Any]:
    return next(e for e in result.report["saturation"] if e["name"].startswith(name))


def _assert_calibrated_on(result: Any, samples: list[tuple[torch.Tensor, ...]]) -> None:
    """The export's calibration saw exactly ``samples``: its first input's values, counted and
    bounded, are theirs."""
    first = _observed(result, "input 0")
    assert first["total"] == sum(sample[0].numel() for sample in samples)
    assert first["observed"] == [
        min(float(sample[0].min()) for sample in samples),
        max(float(sample[0].max()) for sample in samples),
    ]


def test_enumerated_export_has_a_method_per_size_each_verified(enumerated: Any) -> None:
    sizes = enumerated.sizes
    assert sizes["methods"] == {"forward": "32x48", "forward_24x40": "24x40",
                                "forward_40x56": "40x56"}  # fmt: skip
    verified = {(e["method"], e["size"]): e for e in sizes["verified"]}
    assert set(verified) == {(name, size) for name, size in sizes["methods"].items()}
    assert all(e["result"] == "pass" for e in verified.values()), sizes["verified"]
    for name in ("forward_24x40", "forward_40x56"):  # each on its own program, then the written
        assert verified[(name, sizes["methods"][name])]["how"] == "verify_export"
        assert "bit for bit" in verified[(name, sizes["methods"][name])]["written_method"]
        records = verified[(name, sizes["methods"][name])]["records"]
        folder = enumerated.artifacts_root / "methods" / name  # its ETRecord and Model Explorer
        assert {f"methods/{name}/etrecord.bin", f"methods/{name}/etrecord.json"} <= set(records)
        assert any("model_explorer_node_data" in r for r in records), records
        assert all((enumerated.artifacts_root / r).is_file() for r in records)
        assert json.loads((folder / "etrecord.json").read_text())
    assert enumerated.verification["verdict"]["result"] == "pass"
    report = json.loads((enumerated.artifacts_root / "report.json").read_text())
    assert report["sizes"]["methods"] == sizes["methods"]


def test_the_summary_lists_the_methods_and_each_verdict(enumerated: Any) -> None:
    from etkit_exporter.cli.export import _summary

    text = _summary(enumerated, 1.0)
    methods = "forward (32x48), forward_24x40 (24x40), forward_40x56 (40x56)"
    assert f"sizes:\n  methods: {methods}" in text, text
    assert "verified: forward at 32x48 pass, forward_24x40 at 24x40 pass" in text, text


def test_without_verify_every_method_still_has_its_etrecord(tmp_path: Path) -> None:
    """An enumerated export made without ``--verify`` writes each other method's ETRecord in
    ``methods/<method>/`` (its own program, of its size), listed in report.json's
    ``sizes.records`` and named by the summary."""
    from executorch.devtools.etrecord import parse_etrecord

    from etkit_exporter.cli.export import _summary

    model, inputs = DEMOS["flow-warp"]()
    result = export_model(model, inputs, artifacts_root=tmp_path / "x", target="xnnpack",
                          sizes=SIZES[:2])  # fmt: skip
    assert result.verification is None
    records = result.report["sizes"]["records"]
    assert set(records) == {"forward_24x40"}, records
    paths = records["forward_24x40"]
    assert set(paths) == {
        "methods/forward_24x40/etrecord.bin",
        "methods/forward_24x40/etrecord.json",
    }
    record = parse_etrecord(str(result.artifacts_root / "methods/forward_24x40/etrecord.bin"))
    program = record.edge_dialect_program
    shapes = {
        tuple(n.meta["val"].shape[-2:])
        for n in program.graph.nodes
        if n.op == "placeholder" and getattr(n.meta.get("val"), "ndim", 0) == 4
    }
    assert (24, 40) in shapes and (32, 48) not in shapes, shapes
    assert "each other method's ETRecord: methods/forward_24x40" in _summary(result, 1.0)


def test_enumerated_methods_share_quantization_and_weights(enumerated: Any) -> None:
    """One calibration serves every size (made at 40x56, the samples' size, not the example's
    32x48): the IO parameters of every method are forward's, and XNNPACK's weights (named
    data, keyed by their hash) are stored once for all methods."""
    _assert_calibrated_on(enumerated, ENUMERATED_CALIBRATION)
    io = json.loads((enumerated.artifacts_root / "io_quant_params.json").read_text())
    assert set(io["methods"]) == set(enumerated.sizes["methods"])
    for table in io["methods"].values():
        height, width = (int(s) for s in table["size"].split("x"))
        for kind in ("inputs", "outputs"):
            for entry, first in zip(table[kind], io[kind], strict=True):
                assert entry["shape"][-2:] == [height, width]
                assert (entry["scale"], entry["zero_point"]) == (
                    first["scale"],
                    first["zero_point"],
                )
    pte = deserialize_pte_binary((enumerated.artifacts_root / "model.pte").read_bytes())
    # the demo's three convolutions' weights and biases, once for the three methods (each size
    # calibrated on its own gave more: the biases differ with the activations' scales)
    assert len(pte.named_data.pte_data) == 6
    count = {plan.name for plan in pte.program.execution_plan if plan.name.startswith("forward")}
    assert count == set(enumerated.sizes["methods"])
    spent = enumerated.sizes["bytes"]
    # the demo's weights are 1.3 kB: its method plans and XNNPACK graphs are the program; no
    # constant of an image plane is folded: its pixel grid is a row (1 x W x 2), and a column
    # added on rows (H values and a mask of W x 2: etkit-quant's separable fold), float32, so
    # the methods differ by those alone (a plane would be 8 x H x W bytes: 12 kB at 32x48)
    assert set(spent["methods_alone"]) == set(enumerated.sizes["methods"])
    assert spent["program"] < sum(spent["methods_alone"].values())
    assert spent["weights"] == "shared: 6 named data entries stored once for every method"
    # stored once, not once per method: the program saves at least the weights of two methods
    weights = sum(len(buffer) for buffer in pte.named_data.buffers)
    assert spent["shared_bytes"] >= (len(spent["methods_alone"]) - 1) * weights > 0
    rest = []
    for name, size in enumerated.sizes["methods"].items():
        height, width = (int(s) for s in size.split("x"))
        rest.append(spent["methods_alone"][name] - 4 * (4 * width + height))
    # the same bytes but for the grid's, within the alignment of three constants
    assert max(rest) - min(rest) <= 128, spent["methods_alone"]


def test_every_enumerated_method_runs_at_its_size(enumerated: Any, tmp_path: Path) -> None:
    pte = enumerated.artifacts_root / "model.pte"
    for name, size in enumerated.sizes["methods"].items():
        height, width = (int(s) for s in size.split("x"))
        frames = [torch.randint(-127, 128, (1, 3, height, width), dtype=torch.int8) for _ in "ab"]
        (out,) = runtime_method(pte, name).execute(frames)
        assert tuple(out.shape) == (1, 3, height, width)
    for k, frame in enumerate(_frames(40, 56, 1)):
        torch.save(frame, tmp_path / f"in{k}.pt")
    summary = run_export(enumerated.artifacts_root, [tmp_path / "in0.pt", tmp_path / "in1.pt"],
                         tmp_path / "out", size="40x56")  # fmt: skip
    assert summary["method"] == "forward_40x56"
    for k, frame in enumerate(_frames(32, 48, 1)):
        torch.save(frame, tmp_path / f"first{k}.pt")
    first = [tmp_path / "first0.pt", tmp_path / "first1.pt"]
    summary = run_export(enumerated.artifacts_root, first, tmp_path / "out-first", size="32x48")
    assert summary["method"] == "forward"  # the first size's method


def test_range_export_runs_and_verifies_at_five_sizes(ranged: Any) -> None:
    model, result = ranged
    _assert_calibrated_on(result, RANGE_CALIBRATION)  # its one capture, samples of three sizes
    sizes = result.sizes
    assert sizes["dynamic"]["text"] == "16-64x16-96/8"
    verified = [(e["size"], e["result"]) for e in sizes["verified"]]
    assert verified == [("32x48", "pass"), ("16x16", "pass"), ("48x64", "pass"),
                        ("64x96", "pass")]  # fmt: skip
    io = result.io_quant_params
    assert [e["shape"] for e in io["inputs"]] == [[1, 3, 64, 96]] * 2  # the planned bound
    assert [e["min_shape"] for e in io["inputs"]] == [[1, 3, 16, 16]] * 2
    # a fifth size, in none of the verification's: the program against the quantized model
    inputs = _frames(40, 88, 2)
    run = verify_run(result.pte_path, model, result.converted_model, inputs, io, "xnnpack")
    assert run.verification["verdict"]["result"] == "pass"
    assert tuple(run.outputs[0].shape) == (1, 3, 40, 88)
    plan = deserialize_pte_binary(result.pte_path.read_bytes()).program.execution_plan
    assert [p.name for p in plan if p.name.startswith("forward")] == ["forward"]


def test_the_bundle_holds_every_verified_method_and_size(enumerated: Any, ranged: Any) -> None:
    """--bundle: a test case per method (enumerated), per verified size (a range), each the
    verified run's inputs and outputs at its size, and each passes on the written program."""
    bundle = read_bundle(enumerated.artifacts_root / "model.bpte")
    assert {m: [tuple(i[0].shape) for i, _ in c] for m, c in bundle.cases.items()} == {
        "forward": [(1, 3, 32, 48)], "forward_24x40": [(1, 3, 24, 40)],
        "forward_40x56": [(1, 3, 40, 56)],
    }  # fmt: skip
    _, checks = run_bundle(enumerated.artifacts_root / "model.bpte")
    assert {c.method for c in checks} == set(bundle.cases) and all(c.passes for c in checks)
    _, result = ranged
    bundle = read_bundle(result.artifacts_root / "model.bpte")
    heights = [tuple(e[0].shape[-2:]) for e, _ in bundle.cases["forward"]]
    assert list(bundle.cases) == ["forward"]
    assert heights == [(32, 48), (16, 16), (48, 64), (64, 96)]
    _, checks = run_bundle(result.artifacts_root / "model.bpte")
    assert len(checks) == 4 and all(c.passes for c in checks)
    # a case changed by one step on one value is a mismatch: the check can fail
    broken = bundle.cases["forward"][1][1][0].clone()
    broken.view(-1)[0] += 1
    assert not compare([broken], bundle.cases["forward"][1][1], None)[0].passes


def test_range_refuses_a_size_outside_it_at_run_time(ranged: Any, tmp_path: Path) -> None:
    _, result = ranged
    for k, frame in enumerate(_frames(72, 48, 3)):
        torch.save(frame, tmp_path / f"in{k}.pt")
    with pytest.raises(ValueError, match=r"takes \[1, 3, 16\.\.64, 16\.\.96\]"):
        run_export(result.artifacts_root, [tmp_path / "in0.pt", tmp_path / "in1.pt"],
                   tmp_path / "out")  # fmt: skip


def test_a_model_that_fixes_its_size_is_one_line_naming_the_source(tmp_path: Path) -> None:
    model, inputs = DEMOS["flow-warp"]()
    with pytest.raises(SizeError) as caught:
        export_model(model, inputs, artifacts_root=tmp_path / "x", target="xnnpack",
                     dynamic_size=RANGE)  # fmt: skip
    line = str(caught.value)
    assert "\n" not in line
    assert "demos.py:16 in pixel_grid: torch.linspace(-1, 1, height)" in line
    assert "fixes a dynamic size to 32" in line and "list of sizes" in line
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sizes": [(32, 48)], "dynamic_size": RANGE}, "not both"),
        ({"dynamic_size": RANGE, "target": "vgf"}, "target 'vgf' has no dynamic sizes"),
        ({"dynamic_size": ((40, 64), (16, 96))}, "32x48 is not in the range"),
        ({"dynamic_size": ((16, 60), (16, 96), 8)}, "bound 60 is not a multiple of 8"),
        ({"dynamic_size": ((16, 64), (16, 96), 5)}, "bound 16 is not a multiple of 5"),
        ({"sizes": [(24, 40), (24, 40)]}, "lists 24x40 twice"),
        ({"sizes": [(24, 0)]}, "has a side below 1"),
        ({"sizes": "24x40"}, "non-empty list"),
    ],
)
def test_bad_sizes_are_refused_before_any_work(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    model, inputs = DEMOS["flow-warp"]()
    with pytest.raises(SizeError, match=message):
        export_model(model, inputs, artifacts_root=tmp_path / "x",
                     **{"target": "xnnpack", **options})  # fmt: skip
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"sizes": SIZES, "calibration": [_frames(24, 40, 1), _frames(40, 56, 2)]},
            r"calibration samples of 2 sizes \(24x40, 40x56\): an enumerated export is "
            "calibrated at one size",
        ),
        (
            {"sizes": SIZES, "calibration": [_frames(32, 48, 1), _frames(48, 64, 2)]},
            "calibration sample 1 is 48x64, a size this export does not cover",
        ),
        (
            {"dynamic_size": RANGE, "calibration": [_frames(40, 60, 1)]},
            "calibration sample 0 is 40x60, .*its width 60 is not a multiple of 8",
        ),
        (  # checked against the example inputs brought to the sample's size
            {"dynamic_size": RANGE, "calibration": [_frames(32, 48, 1), FOUR_CHANNELS]},
            r"calibration sample 1, input 1 has shape \[1, 4, 24, 40\], but the example input "
            r"has \[1, 3, 24, 40\]",
        ),
    ],
)
def test_calibration_of_sizes_the_export_does_not_take_is_refused_before_any_work(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        export_model(AnySizeFlowWarp().eval(), _frames(32, 48, 0),
                     artifacts_root=tmp_path / "x", target="xnnpack", **options)  # fmt: skip
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "x").exists()


def test_a_range_calibrated_on_sizes_that_disagree_wildly_is_refused(tmp_path: Path) -> None:
    """Samples of two sizes of a range whose first input spans 20 times as much at one as at
    the other: one line naming both sizes, the input and the ranges; nothing written (found
    on the captured float program, in the stage that observes the ranges)."""
    quiet = tuple(frame * 0.05 for frame in _frames(16, 24, 1))
    with pytest.raises(ExportError, match="stage 'observe_ranges' failed") as caught:
        export_model(AnySizeFlowWarp().eval(), _frames(32, 48, 0),
                     artifacts_root=tmp_path / "x", target="xnnpack", dynamic_size=RANGE,
                     calibration=[_frames(32, 48, 0), quiet])  # fmt: skip
    line = str(caught.value)
    assert "\n" not in line
    assert "calibration samples of 16x24 and 32x48 disagree wildly on input 0 (frame0)" in line
    assert "more than 8x" in line and "export the sizes apart" in line
    assert not (tmp_path / "x").exists()


def test_a_size_the_model_cannot_take_is_refused(tmp_path: Path) -> None:
    inputs = (torch.rand(1, 3, 16, 16),)
    with pytest.raises(SizeError, match="cannot take size 17x16: its forward fails there"):
        export_model(Pyramid(), inputs, artifacts_root=tmp_path / "x", target="xnnpack",
                     sizes=[(16, 16), (17, 16)])  # fmt: skip
    assert not (tmp_path / "x").exists()


def test_command_line_sizes_and_config(tmp_path: Path) -> None:
    assert size_options("540x960, 720X1280", None) == {"sizes": [(540, 960), (720, 1280)]}
    assert size_options(None, "256-1088x256-1920/64") == {
        "dynamic_size": ((256, 1088), (256, 1920), 64)
    }
    for sizes, dynamic, message in (
        ("540x96o", None, "'540x96o' is not a size HxW"),
        (None, "256x1088", "is not a range"),
        ("32x48", "16-64x16-96", "not both"),
    ):
        with pytest.raises(SizeError, match=message):
            size_options(sizes, dynamic)
    text = render_config({"demo": "flow-warp", "sizes": "24x40,32x48", "dynamic_size": None})
    (tmp_path / "export.toml").write_text(text)
    assert read_config(tmp_path / "export.toml")["sizes"] == "24x40,32x48"


def test_plan_methods_and_resized_inputs() -> None:
    frames = _frames(32, 48, 4)
    grid = torch.zeros(1, 5, 7, 2)
    plan = check_sizes([(24, 40), (32, 48)], None, (*frames, grid), "vgf")
    assert plan is not None and plan.image_inputs == (0, 1)
    assert plan.methods() == [("forward", (24, 40)), ("forward_32x48", (32, 48))]
    resized = resize_inputs((*frames, grid), plan, (24, 40))
    assert [tuple(x.shape) for x in resized] == [(1, 3, 24, 40), (1, 3, 24, 40), (1, 5, 7, 2)]
    assert SizeRange((16, 64), (16, 96), 8).verification_sizes((32, 48)) == [
        (16, 16), (48, 64), (64, 96), (32, 48)
    ]  # fmt: skip


class _Sample(torch.nn.Module):
    def __init__(self, op: GridSampleOp) -> None:
        super().__init__()
        self.op = op

    def forward(self, image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        i, g, o = self.op.image, self.op.grid, self.op.output
        assert i is not None and g is not None and o is not None
        image = qd.dequantize_per_tensor(
            image, i.scale, i.zero_point, i.quant_min, i.quant_max, i.dtype
        )
        grid = qd.dequantize_per_tensor(
            grid, g.scale, g.zero_point, g.quant_min, g.quant_max, g.dtype
        )
        out = F.grid_sample(image, grid, padding_mode="border", align_corners=False)
        return qd.quantize_per_tensor(out, o.scale, o.zero_point, o.quant_min, o.quant_max, o.dtype)  # type: ignore[no-any-return]


def test_runner_grid_sampler_takes_the_sizes_of_the_call() -> None:
    """The app's grid-sampler delegate in etkit's runner: a version-3 blob (dynamic sizes)
    checked against its bounds, the output resized to what the kernel computed, bit for bit
    executorch.runtime's C++ backend at every size."""
    snorm8 = QParams(1 / 127, 0, -127, 127, torch.int8)
    op = GridSampleOp("bilinear", "border", False, snorm8,
                      QParams(1 / 32767, 0, -32767, 32767, torch.int16), snorm8)  # fmt: skip
    image = torch.randint(-127, 128, (1, 4, 16, 24), dtype=torch.int8)
    grid = torch.randint(-32767, 32768, (1, 12, 20, 2), dtype=torch.int16)
    dims = ({2: Dim("h", min=4, max=64), 3: Dim("w", min=4, max=96)},
            {1: Dim("ho", min=2, max=48), 2: Dim("wo", min=2, max=80)})  # fmt: skip
    exported = torch.export.export(_Sample(op), (image, grid), dynamic_shapes=dims, strict=True)
    pte = to_edge_transform_and_lower(exported, partitioner=[GridSamplerPartitioner()])
    data = pte.to_executorch().buffer
    program = program_from_bytes(data)
    method = runtime_method(data)
    for h, w, ho, wo in ((16, 24, 12, 20), (64, 96, 48, 80), (5, 7, 3, 2), (33, 17, 21, 9)):
        image = torch.randint(-127, 128, (1, 4, h, w), dtype=torch.int8)
        grid = torch.randint(-32767, 32768, (1, ho, wo, 2), dtype=torch.int16)
        (got,) = program.run([image, grid]).outputs
        (want,) = method.execute([image, grid])
        assert torch.equal(got.contiguous(), want.contiguous())
        assert torch.equal(got.contiguous(), cpu.grid_sample(image, grid, op).contiguous())
    with pytest.raises(Exception, match=r"4\.\.64"):
        program.run([torch.zeros(1, 4, 3, 20, dtype=torch.int8), grid])  # below the bound


def test_enumerated_vgf_export_is_a_vgf_per_size_each_verified(tmp_path: Path) -> None:
    """VGF: one method per size, each one VGF with etkit's sampler inside, verified in etkit's
    runner on Vulkan; the extra methods' bytes in the report (a VGF shares no weights)."""
    model, inputs = DEMOS["flow-warp"]()
    result = export_model(model, inputs, artifacts_root=tmp_path / "vgf", target="vgf",
                          sizes=SIZES[:2], verify=True, scenario=True)  # fmt: skip
    sizes = result.sizes
    assert sizes["methods"] == {"forward": "32x48", "forward_24x40": "24x40"}
    assert [(e["method"], e["result"]) for e in sizes["verified"]] == [
        ("forward", "pass"), ("forward_24x40", "pass")
    ]  # fmt: skip
    program = deserialize_pte_binary(result.pte_path.read_bytes()).program
    for plan in program.execution_plan:
        if plan.name.startswith("forward"):
            assert [d.id for d in plan.delegates] == ["VgfBackend"], plan.name
    spent = sizes["bytes"]
    assert set(spent["methods_alone"]) == {"forward", "forward_24x40"}
    # a VGF holds its weights: the program is about the two methods' programs together
    assert spent["program"] < sum(spent["methods_alone"].values())
    assert spent["weights"] == "not shared: each method's VGF holds its weights compiled in"
    assert "weights not shared: each method's VGF" in "\n".join(size_lines(sizes))
    # --scenario: one scenario per method, each run on Vulkan and equal to the program's method
    report = json.loads((result.artifacts_root / "report.json").read_text())
    scenarios = {"forward": report["scenario"], **report["scenario"]["methods"]}
    assert {m: (s["written"], s["folder"]) for m, s in scenarios.items()} == {
        "forward": (True, "scenario"), "forward_24x40": (True, "scenario_forward_24x40"),
    }, scenarios  # fmt: skip
    assert all("equal the program's" in s["checked"] for s in scenarios.values())
    side = json.loads((result.artifacts_root / "scenario_forward_24x40/etkit_scenario.json")
                      .read_text())  # fmt: skip
    assert [io["shape"][-2:] for io in side["inputs"]] == [[24, 40]] * 2, side["inputs"]
