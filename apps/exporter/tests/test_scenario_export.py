"""One Vulkan scenario per export: ``export_model(..., scenario=True)`` writes
``scenario/``, and ``scenario_runner`` runs the whole program from it in one process on lavapipe,
bit-identical to etkit's ``.pte`` runner with the Vulkan grid-sampler kernel.

The exports are shared (one per model, module-scoped); each scenario run is one
``scenario_runner`` process (0.5-4 s here)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etkit_exporter import ExportResult, export_model
from etkit_exporter.check.bundle import BundleCase
from etkit_exporter.core.io_params import program_input
from etkit_exporter.export import scenarios
from etkit_exporter.export.demos import DEMOS
from etkit_exporter.programs import built_in_backends, load_program
from etkit_exporter.vgf.scenario import run_scenario
from etkit_exporter.vgf.scenario_writer import (
    SCENARIO_DIR,
    SCENARIO_JSON,
    SIDECAR_JSON,
    ScenarioUnsupportedError,
    plan_scenario,
    write_scenario,
)
from etkit_pterunner import (
    DelegateInfo,
    Instruction,
    ListInfo,
    MethodInfo,
    PteProgram,
    ScalarInfo,
    TensorInfo,
)

REPO = Path(__file__).resolve().parents[3]


def _real_models() -> Any:
    """``tests/real_models.py`` of the repository (imported by path, as tests/ does)."""
    if "real_models" in sys.modules:
        return sys.modules["real_models"]
    spec = importlib.util.spec_from_file_location("real_models", REPO / "tests" / "real_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_models"] = module
    spec.loader.exec_module(module)
    return module


DEMO_NAMES = ("flow-warp", "stn", "resample")
_EXPORTS: dict[str, ExportResult] = {}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("scenario-exports")

    def get(name: str) -> ExportResult:
        if name not in _EXPORTS:
            options: dict[str, Any] = {}
            if name in DEMOS:
                model, inputs = DEMOS[name]()
            else:
                case = _real_models().REAL_MODELS[name]
                model, inputs = case.make()
                options = {
                    "quantized_input_qspecs": case.input_qspecs,
                    "quantized_output_qspecs": case.output_qspecs,
                }
            # the split program (VGF dispatches and etkit's shader between them); the scenario
            # of a one-VGF export (one dispatch_vgf): tests/test_one_vgf.py
            _EXPORTS[name] = export_model(
                model,
                inputs,
                artifacts_root=root / name,
                target="vgf",
                scenario=True,
                sampler_delegate=True,
                **options,
            )
        return _EXPORTS[name]

    return get


def _program_inputs(result: ExportResult) -> list[torch.Tensor]:
    return [
        program_input(x, entry)
        for x, entry in zip(result.example_inputs, result.io_quant_params["inputs"], strict=True)
    ]


def _runner_outputs(result: ExportResult, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    program = load_program(result.pte_path, grid_sampler_impl="vulkan")
    return [y for y in program.run(inputs).outputs]


def _differing(actual: np.ndarray, expected: torch.Tensor) -> int:
    got = torch.from_numpy(np.ascontiguousarray(actual))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    return int((got != expected).sum())


# (every real model of tests/real_models.py: tests/test_real_models.py)
# the STN's on demand (-m extended); flow-warp's and resample's run in CI
@pytest.mark.parametrize(
    "name",
    [n if n != "stn" else pytest.param(n, marks=pytest.mark.extended) for n in DEMO_NAMES],
)
def test_scenario_is_bit_identical_to_the_runner(exported: Any, name: str) -> None:
    result = exported(name)
    folder = result.artifacts_root / SCENARIO_DIR
    inputs = _program_inputs(result)
    sidecar = json.loads((folder / SIDECAR_JSON).read_text())
    for value, io in zip(inputs, sidecar["inputs"], strict=True):  # the example inputs, as given
        stored = np.load(folder / io["file"])
        expected = value.permute(io["dim_order"]).contiguous().numpy()
        np.testing.assert_array_equal(stored, expected.reshape(stored.shape))
    outputs = run_scenario(folder)
    expected_outputs = _runner_outputs(result, inputs)
    assert len(outputs) == len(expected_outputs)
    differing = [_differing(a, b) for a, b in zip(outputs, expected_outputs, strict=True)]
    print(f"{name}: values differing per output {differing} of {[a.size for a in outputs]}")
    assert differing == [0] * len(outputs)


def test_the_check_takes_the_verified_run_of_the_same_inputs(
    exported: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export with --verify checks its scenario against the outputs its verification's run
    gave (no second run of the program: on VGF, a scenario_runner process), and only when that
    run's inputs are the scenario's, bit for bit; otherwise it runs the program."""
    result = exported("flow-warp")
    inputs = _program_inputs(result)
    verified = BundleCase("forward", inputs, _runner_outputs(result, inputs))
    folder = tmp_path / "scenario"
    shutil.copytree(result.artifacts_root / SCENARIO_DIR, folder)

    def no_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the program was run again")

    monkeypatch.setattr(scenarios, "load_program", no_run)
    section = scenarios.checked_scenario(
        result.artifacts_root, folder, inputs, "forward", {"written": True}, verified
    )
    assert section["written"] and "equal the program's" in section["checked"], section
    other = [x.clone() for x in inputs]
    other[0][(0,) * other[0].dim()] += 1
    with pytest.raises(AssertionError, match="run again"):
        scenarios.checked_scenario(
            result.artifacts_root, folder, other, "forward", {"written": True}, verified
        )


def _simulate(scenario: dict[str, Any]) -> None:
    """Checks the scenario's synchronization: every resource a dispatch reads that an earlier
    dispatch wrote (through any resource of the same memory) has a memory barrier from the
    writer's stage to the reader's in between; dispatches carry no implicit barrier."""
    resources = {next(iter(r.values()))["uid"]: r for r in scenario["resources"]}
    barriers = {uid: r["memory_barrier"] for uid, r in resources.items() if "memory_barrier" in r}

    def memory(uid: str) -> str:
        body = next(iter(resources[uid].values()))
        group = body.get("memory_group")
        return str(group["id"]) if group else uid

    written: dict[str, str] = {}  # memory -> stage of the last write
    visible: dict[str, set[str]] = {}
    for command in scenario["commands"]:
        ((kind, body),) = command.items()
        if kind == "pipeline_barrier":
            for uid in body["memory_barrier_refs"]:
                barrier = barriers[uid]
                for mem, stage in written.items():
                    if stage in barrier["src_stage"] or "all" in barrier["src_stage"]:
                        visible[mem] |= set(barrier["dst_stage"])
            continue
        assert body["implicit_barrier"] is False
        stage = "graph" if kind == "dispatch_vgf" else "compute"
        refs = [b["resource_ref"] for b in body["bindings"]]
        accesses = [next(iter(resources[ref].values()))["shader_access"] for ref in refs]
        for ref, access in zip(refs, accesses, strict=True):
            mem = memory(ref)
            if access != "writeonly" and mem in written:
                assert stage in visible[mem], f"{ref} read by {kind} without a barrier"
        for ref, access in zip(refs, accesses, strict=True):
            if access != "readonly":
                written[memory(ref)] = stage
                visible[memory(ref)] = set()


# resample's program (a VGF and two dispatches of etkit's shader, exported for the tests above)
# in CI; the stereo-depth network's (35 s of export) on demand
@pytest.mark.parametrize(
    "name", ["flow-warp", "resample", pytest.param("stereo-depth", marks=pytest.mark.extended)]
)
def test_scenario_structure_and_report(exported: Any, name: str) -> None:
    result = exported(name)
    folder = result.artifacts_root / SCENARIO_DIR
    scenario = json.loads((folder / SCENARIO_JSON).read_text())
    program = PteProgram.load(result.pte_path)
    method = program.method()
    calls = [
        method.delegates[i.delegate].backend_id for i in method.chains[0] if i.kind == "delegate"
    ]
    dispatches = [
        "VgfBackend" if "dispatch_vgf" in c else "GridSamplerBackend"
        for c in scenario["commands"]
        if "pipeline_barrier" not in c
    ]
    assert dispatches == calls  # one dispatch per delegate call, in the program's order
    _simulate(scenario)
    section = json.loads((result.artifacts_root / "report.json").read_text())["scenario"]
    assert section["written"] is True
    assert [d["backend"] for d in section["dispatches"]] == calls
    assert section["bytes"] == sum((folder / f).stat().st_size for f in section["files"])
    manifest = json.loads((result.artifacts_root / "etkit-manifest.json").read_text())
    listed = json.dumps(manifest)
    for file in section["files"]:
        assert f"{SCENARIO_DIR}/{file}" in listed
    # a VGF output the shader reads is the same memory as the shader's buffer
    groups = {}
    for resource in scenario["resources"]:
        ((kind, body),) = resource.items()
        if "memory_group" in body:
            groups.setdefault(body["memory_group"]["id"], set()).add(kind)
    assert {"tensor", "buffer"} in groups.values()
    # each sampler dispatch runs the shader specialized for its configuration
    from etkit_gridsampler.vulkan import SPECIALIZATION_CONSTANTS

    sidecar = json.loads((folder / SIDECAR_JSON).read_text())
    computes = [c["dispatch_compute"] for c in scenario["commands"] if "dispatch_compute" in c]
    described = [d for d in sidecar["dispatches"] if d["command"] == "dispatch_compute"]
    assert computes and len(computes) == len(described)
    shaders = {
        r["shader"]["uid"]: r["shader"].get("specialization_constants")
        for r in scenario["resources"]
        if "shader" in r
    }
    for command, description in zip(computes, described, strict=True):
        constants = {
            SPECIALIZATION_CONSTANTS[c["id"]]: c["value"] for c in shaders[command["shader_ref"]]
        }
        assert constants == description["specialization_constants"]
        assert constants["mode"] == (0 if description["op"]["mode"] == "bilinear" else 1)


def test_changed_input_changes_the_output(exported: Any, tmp_path: Path) -> None:
    """The scenario reads its inputs: another image in resample's input_0.npy changes both
    outputs exactly as it changes the runner's."""
    result = exported("resample")
    folder = tmp_path / "scenario"
    shutil.copytree(result.artifacts_root / SCENARIO_DIR, folder)
    inputs = _program_inputs(result)
    before = run_scenario(folder)
    changed = [torch.roll(inputs[0], shifts=(5, 7), dims=(2, 3)).flip(1), inputs[1]]
    sidecar = json.loads((folder / SIDECAR_JSON).read_text())
    io = sidecar["inputs"][0]
    np.save(folder / io["file"], changed[0].permute(io["dim_order"]).contiguous().numpy())
    after = run_scenario(folder)  # the folder's own, edited, input_0.npy
    expected = _runner_outputs(result, changed)
    for old, new, wanted in zip(before, after, expected, strict=True):
        assert _differing(old, wanted) > 0  # the output changed...
        assert _differing(new, wanted) == 0  # ...as the runner's did
    again = run_scenario(result.artifacts_root / SCENARIO_DIR, inputs=changed)  # the API's way
    assert [_differing(a, b) for a, b in zip(again, expected, strict=True)] == [0, 0]


def test_two_samplers_and_a_sampler_feeding_only_the_output(exported: Any) -> None:
    for name, samplers in (("resample", 2), ("stn", 1)):
        result = exported(name)
        sidecar = json.loads((result.artifacts_root / SCENARIO_DIR / SIDECAR_JSON).read_text())
        computes = [d for d in sidecar["dispatches"] if d["command"] == "dispatch_compute"]
        assert len(computes) == samplers
        scenario = json.loads((result.artifacts_root / SCENARIO_DIR / SCENARIO_JSON).read_text())
        resources = {
            next(iter(r.values()))["uid"]: next(iter(r.values())) for r in scenario["resources"]
        }
        # resample's output 1 and stn's output 0 are a sampler's output, nothing else reads them:
        # the output tensor (its .npy) aliases the shader's output buffer
        output = sidecar["outputs"][1 if name == "resample" else 0]
        group = resources[output["resource"]]["memory_group"]["id"]
        written = {w for d in computes for w in d["writes"]}
        assert any(resources[w].get("memory_group", {}).get("id") == group for w in written)


def test_texture_outputs_alias_an_image(exported: Any, tmp_path: Path) -> None:
    """resample's output 0 (RGBA SNORM8, written by a VGF) is declared with an
    R8G8B8A8_SNORM image in its memory; reading that image back gives the output's texels.
    Inputs and outputs the shader reads or writes as packed words get no image, and say why."""
    from etkit_exporter.vgf.vulkan_env import ml_emulation_env

    result = exported("resample")
    folder = result.artifacts_root / SCENARIO_DIR
    sidecar = json.loads((folder / SIDECAR_JSON).read_text())
    texture = sidecar["outputs"][0]["texture"]
    assert texture["image"] is not None and texture["image_format"] == "VK_FORMAT_R8G8B8A8_SNORM"
    assert sidecar["inputs"][0]["texture"]["image"] is None
    assert "packed 32-bit words" in sidecar["inputs"][0]["texture"]["why_no_image"]
    scenario = json.loads((folder / SCENARIO_JSON).read_text())
    for resource in scenario["resources"]:
        body = resource.get("image")
        if body is not None and body["uid"] == texture["image"]:
            body["dst"] = "image.dds"
        for value in resource.values():
            if "src" in value:
                value["src"] = str(folder / value["src"])
    (tmp_path / "s.json").write_text(json.dumps(scenario))
    import subprocess

    from etkit_exporter.vgf.tools import find_tool

    done = subprocess.run(
        [find_tool("scenario_runner"), "--scenario", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        env=ml_emulation_env(),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    output = np.load(tmp_path / "output_0.npy")
    texels = np.frombuffer((tmp_path / "image.dds").read_bytes()[-output.nbytes :], np.int8)
    np.testing.assert_array_equal(texels.reshape(output.shape), output)


def test_unsupported_program_is_refused_and_the_pte_still_exported(tmp_path: Path) -> None:
    model, inputs = DEMOS["stn"]()
    result = export_model(
        model,
        inputs,
        artifacts_root=tmp_path / "float",
        target="vgf",
        enable_pt2e_quantization=False,  # a float grid sampler: no Vulkan kernel for it
        scenario=True,
    )
    assert result.pte_path.is_file()
    assert not (result.artifacts_root / SCENARIO_DIR).exists()
    section = result.report["scenario"]
    assert section["written"] is False
    assert (
        "instruction 1: delegate 1 (GridSamplerBackend): a float32 grid sampler"
        in section["reason"]
    )
    on_disk = json.loads((result.artifacts_root / "report.json").read_text())
    assert on_disk["scenario"] == section
    with pytest.raises(ValueError, match="scenario applies to target 'vgf' only"):
        export_model(model, inputs, artifacts_root=tmp_path / "x", target="xnnpack", scenario=True)


# -- kernel instructions between delegates: views alias, copies that move bytes are refused --


def _sampler_blob(image_shape: tuple[int, ...], grid_shape: tuple[int, ...]) -> bytes:
    from etkit_gridsampler.delegate_format import ArgumentRoles, encode
    from etkit_gridsampler.op import GridSampleOp, QParams

    op = GridSampleOp(
        mode="bilinear",
        padding_mode="border",
        align_corners=False,
        image=QParams(1 / 127, 0, -127, 127, torch.int8),
        grid=QParams(1 / 32767, 0, -32767, 32767, torch.int16),
        output=QParams(1 / 127, 0, -127, 127, torch.int8),
    )
    return encode(op, image_shape, grid_shape, roles=ArgumentRoles(2, 0, 1))


def _method(operator: str, view_sizes: tuple[int, ...], view_order: tuple[int, ...]) -> MethodInfo:
    """Two grid samplers, the first's output passed to the second through ``operator``."""

    def planned(index: int, dtype: torch.dtype, sizes: tuple[int, ...], offset: int) -> TensorInfo:
        code = {torch.int8: "CHAR", torch.int16: "SHORT"}[dtype]
        order = view_order if index == 8 else tuple(range(len(sizes)))
        return TensorInfo(index, code, dtype, sizes, order, "planned", 1, offset)

    values = (
        planned(0, torch.int8, (1, 2, 6, 8), 0),
        planned(1, torch.int16, (1, 6, 8, 2), 128),
        planned(2, torch.int8, (1, 2, 6, 8), 320),
        *(ScalarInfo(3 + k, "int", size) for k, size in enumerate(view_sizes)),
        ListInfo(7, "int", (3, 4, 5, 6)),
        planned(8, torch.int8, view_sizes, 448),
        planned(9, torch.int8, (1, 2, 6, 8), 576),
    )
    delegates = (
        DelegateInfo(
            "forward", 0, "GridSamplerBackend", _sampler_blob((1, 2, 6, 8), (1, 6, 8, 2)), (), (0,)
        ),
        DelegateInfo(
            "forward", 1, "GridSamplerBackend", _sampler_blob(view_sizes, (1, 6, 8, 2)), (), (2,)
        ),
    )
    chain = (
        Instruction(0, "delegate", (0, 1, 2), delegate=0),
        Instruction(1, "kernel", (2, 7, 8, 8), operator=0),  # inputs, out, the returned out
        Instruction(2, "delegate", (8, 1, 9), delegate=1),
    )
    return MethodInfo(
        "forward", values, (0, 1), (9,), (operator,), delegates, (chain,), (0, 704), (), ()
    )


def test_view_between_samplers_is_an_alias(tmp_path: Path) -> None:
    method = _method("aten::view_copy.out", (1, 2, 8, 6), (0, 1, 2, 3))
    generator = torch.Generator().manual_seed(5)
    image = torch.randint(-127, 128, (1, 2, 6, 8), dtype=torch.int8, generator=generator)
    grid = torch.randint(-32767, 32768, (1, 6, 8, 2), dtype=torch.int16, generator=generator)
    summary = write_scenario(tmp_path / "s", method, [image, grid])
    assert summary["aliases"] and "aten::view_copy.out value 2 -> value 8" in summary["aliases"][0]
    (actual,) = run_scenario(tmp_path / "s")
    program = PteProgram([method], source="synthetic", size=0, backends=built_in_backends("vulkan"))
    (expected,) = program.run([image, grid]).outputs
    assert _differing(actual, expected) == 0


def test_copy_that_moves_bytes_is_refused() -> None:
    method = _method("dim_order_ops::_clone_dim_order.out", (1, 2, 6, 8), (0, 2, 3, 1))
    with pytest.raises(ScenarioUnsupportedError) as refused:
        plan_scenario(method)
    assert "instruction 1: operator dim_order_ops::_clone_dim_order.out copies value 2" in str(
        refused.value
    )
    method = _method("aten::add.out", (1, 2, 8, 6), (0, 1, 2, 3))
    with pytest.raises(ScenarioUnsupportedError, match=r"instruction 1: kernel operator aten::add"):
        plan_scenario(method)


def test_etkit_run_scenario_writes_what_run_scenario_returns(exported: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    result = exported("resample")
    folder = result.artifacts_root / SCENARIO_DIR
    etkit = str(Path(sys.executable).parent / "etkit")
    done = subprocess.run(
        [etkit, "run", "--scenario", str(folder), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "scenario_runner" in done.stdout
    expected = run_scenario(folder)
    for k, array in enumerate(expected):
        np.testing.assert_array_equal(np.load(tmp_path / "out" / f"output_{k}.npy"), array)
        assert (tmp_path / "out" / f"output_{k}.png").is_file()
    for args, message in (
        (["--scenario", str(tmp_path)], "no scenario.json there"),
        (["--scenario", str(folder), str(result.pte_path)], "one of them"),
        ([], "one of them"),
    ):
        done = subprocess.run(
            [etkit, "run", *args, "--out", str(tmp_path / "x")],
            capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert not (tmp_path / "x").exists()


class _RemapGridFirst(torch.nn.Module):
    """``remap(grid, image)`` with an RGBA image given as an input."""

    def forward(self, grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(image, grid, align_corners=False)


@pytest.mark.parametrize(("width", "image"), [(24, False), (32, True)])
def test_an_input_image_aliases_only_rows_without_padding(
    width: int, image: bool, tmp_path: Path
) -> None:
    """A 24-pixel RGBA input row is 96 bytes, which a linear image on lavapipe lays at a
    128-byte pitch, and the VGF read the aliased input as if packed: 1254 of 1280 scenario
    outputs were wrong (the export then refused its scenario). Such an input gets no image and
    the scenario is kept; a 32-pixel row (128 bytes) keeps its image."""
    torch.manual_seed(5)
    inputs = (torch.rand(1, 16, 20, 2) * 2 - 1, torch.rand(1, 4, 24, width) * 2 - 1)
    result = export_model(
        _RemapGridFirst().eval(), inputs, artifacts_root=tmp_path / "remap", target="vgf",
        scenario=True,
    )  # fmt: skip
    section = result.report["scenario"]
    assert section.get("written"), section.get("reason")
    sidecar = json.loads((result.artifacts_root / SCENARIO_DIR / SIDECAR_JSON).read_text())
    texture = sidecar["inputs"][1]["texture"]
    if image:
        assert texture["image"] is not None, texture
    else:
        assert texture["image"] is None and "not a multiple of 64" in texture["why_no_image"]
