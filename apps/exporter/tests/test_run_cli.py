"""``etkit run``: a real VGF export run from files, its outputs written; bad programs and inputs
refused with one line and no output files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from etkit_exporter import export_model
from etkit_exporter.cli import main
from etkit_exporter.demos import DEMOS


@pytest.fixture(scope="module")
def stn_vgf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, inputs = DEMOS["stn"]()
    return export_model(model, inputs, artifacts_root=tmp_path_factory.mktemp("run") / "stn")


def test_run_writes_outputs_matching_the_quantized_model(
    stn_vgf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = stn_vgf.example_inputs[0]
    np.save(tmp_path / "in.npy", image.numpy())
    status = main(["run", str(stn_vgf.pte_path), "--input", str(tmp_path / "in.npy"),
                   "--out", str(tmp_path / "out")])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "VgfBackend" in printed and "GridSamplerBackend" in printed and " ms" in printed
    output = torch.from_numpy(np.load(tmp_path / "out" / "output_0.npy"))
    entry = stn_vgf.io_quant_params["outputs"][0]
    with torch.no_grad():
        reference = stn_vgf.converted_model(*stn_vgf.example_inputs)
    steps = ((output.float() - entry["zero_point"]) * entry["scale"] - reference).abs()
    assert float(steps.max()) / entry["scale"] <= 1.0 + 1e-6
    with Image.open(tmp_path / "out" / "output_0.png") as picture:
        assert picture.size == (output.shape[3], output.shape[2])


def test_bad_inputs_and_programs_write_nothing(
    stn_vgf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "small.npy", np.zeros((1, 4, 8, 8), dtype=np.float32))
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(stn_vgf.pte_path.read_bytes()[:300])
    cases = [
        ([str(stn_vgf.pte_path), "--input", str(tmp_path / "small.npy")], "shape [1, 4, 8, 8]"),
        ([str(stn_vgf.pte_path)], "takes 1 inputs; 0 --input given"),
        ([str(truncated), "--input", str(tmp_path / "small.npy")], "truncated.pte"),
        ([str(stn_vgf.pte_path), "--input", str(tmp_path / "nope.npy")], "no such file"),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        assert main(["run", *args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
