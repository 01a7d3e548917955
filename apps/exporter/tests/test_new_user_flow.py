"""What a new user does in the first hour, as the docs' guides show it: a model file of their
own that imports a module beside it, exported from its folder with `-m mymodel:make`,
calibration PNGs in per-sample folders with `--image-range -1,1`, a bundled XNNPACK export;
then `etkit run` on inputs of the wrong kind, the program without its io_quant_params.json, and
the run guide's pybindings snippet for the bundle. One export serves every test here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etkit_exporter.cli.main import main

HELPERS = """\
import torch


def conv(c_in, c_out):
    return torch.nn.Conv2d(c_in, c_out, 3, padding=1)
"""

MYMODEL = """\
import torch
import torch.nn.functional as F
from helpers import conv


class FlowWarp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.flow = conv(6, 2)

    def forward(self, frame0, frame1):
        flow = torch.tanh(self.flow(torch.cat([frame0, frame1], 1)))
        n, _, h, w = frame0.shape
        theta = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]).expand(n, 2, 3)
        base = F.affine_grid(theta, (n, 3, h, w), align_corners=False)
        grid = base + 0.1 * flow.permute(0, 2, 3, 1)
        return F.grid_sample(frame1, grid, align_corners=False)


def make():
    torch.manual_seed(0)
    return FlowWarp(), (torch.rand(1, 3, 16, 16) * 2 - 1, torch.rand(1, 3, 16, 16) * 2 - 1)
"""

# The guide holding the pybindings snippet (docs/how-to/run.md of the repository).
RUN_GUIDE = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "run.md"


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The user's folder after `etkit-export -m mymodel:make ... --bundle -o out` in it."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "mymodel.py").write_text(MYMODEL)
    rng = np.random.default_rng(0)
    for sample in range(3):
        (folder / "frames" / f"sample_{sample}").mkdir(parents=True)
        for name in ("a.png", "b.png"):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels, mode="RGB").save(folder / "frames" / f"sample_{sample}" / name)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "etkit-export"), "-m", "mymodel:make",
         "--calibration", "frames", "--image-range", "-1,1", "-t", "xnnpack", "--bundle",
         "-o", "out"],
        cwd=folder, capture_output=True, text=True, timeout=900, check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    return folder, done


def test_the_documented_export_works(user: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    folder, done = user
    assert done.returncode == 0, done.stderr[-3000:]
    assert "calibration: 3 samples" in done.stdout
    out = folder / "out"
    io = json.loads((out / "io_quant_params.json").read_text())
    assert [e["name"] for e in io["inputs"]] == ["frame0", "frame1"]
    assert [e["name"] for e in io["outputs"]] == ["output_0"]  # not the graph's getitem_N
    assert re.search(r"output 0 output_0 +int8", done.stdout), done.stdout
    assert not any((out / "intermediates").iterdir())  # XNNPACK writes none...
    assert "intermediates" not in done.stdout  # ...and the summary does not list the folder
    with Image.open(out / "verify_output_0.png") as picture:  # float, quantized, program, 2 maps
        assert picture.size[0] == 5 * 128 + 4 * 4


def test_run_names_the_input_of_a_wrong_dtype(
    user: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On XNNPACK (executorch.runtime) a wrong dtype is refused naming the input, the dtype
    given and the one expected, not with the runtime's error code."""
    folder, _ = user
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 16, 16), dtype=np.int16))
    np.save(tmp_path / "b.npy", np.zeros((1, 3, 16, 16), dtype=np.float32))
    status = main(["run", str(folder / "out"), "--input", str(tmp_path / "a.npy"),
                   "--input", str(tmp_path / "b.npy"), "--out", str(tmp_path / "o")])  # fmt: skip
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "input 0 (frame0) takes int8 [1, 3, 16, 16], got int16" in err
    assert "method.cpp" not in err and "0x" not in err
    assert not (tmp_path / "o").exists()


def test_run_without_io_quant_params_says_so(
    user: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, _ = user
    shutil.copy(folder / "out" / "model.pte", tmp_path / "alone.pte")
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", np.zeros((1, 3, 16, 16), dtype=np.float32))
    args = ["run", str(tmp_path / "alone.pte"), "--input", str(tmp_path / "a.npy"),
            "--input", str(tmp_path / "b.npy")]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "takes int8" in err and "got float32" in err
    assert "no io_quant_params.json beside the program" in err
    for name in ("a", "b"):  # integers it takes as they are
        np.save(tmp_path / f"{name}.npy", np.zeros((1, 3, 16, 16), dtype=np.int8))
    assert main([*args, "--out", str(tmp_path / "o")]) == 0


def _readme_pybindings_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", RUN_GUIDE.read_text(), flags=re.DOTALL)
    (snippet,) = [b for b in blocks if "_load_bundled_program_from_buffer" in b]
    return snippet


def test_readme_pybindings_snippet_checks_the_bundle(
    user: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The run guide's code, as written, in the export's folder; the grid-sampler backend's
    registration in it is what makes it work."""
    folder, _ = user
    snippet = _readme_pybindings_snippet()

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code], cwd=folder / "out", capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip

    done = run(snippet)
    assert done.returncode == 0, done.stderr[-2000:]
    without = "\n".join(line for line in snippet.splitlines() if "grid_sampler_runtime" not in line)
    failed = run(without)
    assert failed.returncode != 0
    assert "GridSamplerBackend is not registered" in failed.stdout + failed.stderr


def test_run_takes_the_export_folder_and_says_what_it_clips(
    user: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`etkit run out` (the folder, as `etkit inspect` takes it). Pixel values in [0, 255] given
    to an input quantized for [-1, 1]: the run goes on (the quantization clips them) and says
    how many values, and the range; values within the range draw no warning."""
    folder, _ = user
    rng = np.random.default_rng(1)
    pixels = rng.uniform(0, 255, (1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "pixels.npy", pixels)
    np.save(tmp_path / "inside.npy", pixels / 127.5 - 1)
    run = ["run", str(folder / "out"), "--input", str(tmp_path / "pixels.npy"),
           "--input", str(tmp_path / "inside.npy")]  # fmt: skip
    assert main([*run, "--out", str(tmp_path / "o1")]) == 0
    err = capsys.readouterr().err
    outside = int((pixels > 1 + 1 / 254).sum())
    assert (
        f"pixels.npy: {outside} of {pixels.size} values of input 0 (frame0) lie outside [-1, 1]"
        in err
    )
    assert "pixel values in [0, 255]?" in err and "inside.npy" not in err
    assert len([line for line in err.splitlines() if line.startswith("etkit run:")]) == 1, err
    assert (tmp_path / "o1" / "output_0.npy").is_file()


def test_outputs_are_named_after_the_models_return() -> None:
    """io_quant_params.json's output names: the keys of a returned dict, else output_K (the
    graph's node names, such as getitem_2, mean nothing to a caller)."""
    import torch

    from etkit_exporter.core.io_params import output_names

    class Named(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"warped": x * 2, "flow": x + 1}

    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            parts = torch.split(x, 1)
            return parts[1], parts[0]

    example = (torch.rand(2, 3),)
    assert output_names(torch.export.export(Named(), example)) == ["warped", "flow"]
    program = torch.export.export(Pair(), example)
    assert "getitem" in str(program.graph_signature.user_outputs)
    assert output_names(program) == ["output_0", "output_1"]
