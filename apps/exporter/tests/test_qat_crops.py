"""QAT as users train (issue 55): one module prepared by ``qat_prepare`` with a dynamic batch and a
range of crop sizes trains on batches of random crops (4 x 64 x 96, then 2 x 96 x 128) and is
exported at the render size (144 x 256), at a list of sizes and at a range; each size's program
is within one step of the trained module's eval forward at that size. The model builds its base
grid from the input's shape (batch included): a fixed-size capture folds it into a constant of
that shape, which used to land in the checkpoint and tie it to one batch and crop. The state
dict now holds learnt parameters and fake-quantize state only. Bad input gets one line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from etkit_exporter import ExportResult, export_model, qat_prepare
from etkit_exporter.core.io_params import float_output, program_input
from etkit_exporter.export.demos import AnySizeFlowWarp, flow_warp, moving_textures
from etkit_exporter.export.qat import check_checkpoint
from etkit_exporter.export.sizes import SizeError
from etkit_exporter.programs.runtime import runtime_method
from etkit_quant import QatGraphModule

pytestmark = pytest.mark.slow

RANGE = ((64, 144), (96, 256), 16)
CROPS = [(4, 64, 96), (2, 96, 128)]  # batch, height, width of the training batches
RENDER = (144, 256)


def frames(batch: int, height: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = moving_textures(batch, height, width, max_flow=2.0, seed=seed)
    return torch.cat([a for a, _, _ in pairs]), torch.cat([b for _, b, _ in pairs])


@dataclass
class Trained:
    model: torch.nn.Module  # the float model it was prepared from
    prepared: QatGraphModule
    losses: list[float]


@pytest.fixture(scope="module")
def trained() -> Trained:
    torch.manual_seed(0)
    model = AnySizeFlowWarp().eval()
    calibration = [frames(2, 64, 96, 1), frames(1, 96, 128, 2)]  # two batches, two crops
    prepared = qat_prepare(
        model, frames(1, 64, 96, 3), target="xnnpack", calibration=calibration,
        dynamic_size=RANGE,
    )  # fmt: skip
    optimizer = torch.optim.Adam(prepared.parameters(), lr=2e-3)
    losses = []
    for step, (batch, height, width) in enumerate(CROPS * 2):
        frame0, frame1 = frames(batch, height, width, 10 + step)
        loss = F.l1_loss(prepared(frame0, frame1), frame1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    prepared.eval()
    return Trained(model, prepared, losses)


def _steps_apart(
    result: ExportResult, prepared: QatGraphModule, size: tuple[int, int], method: str
) -> int:
    """The program's ``method`` at ``size`` (held-out frames) against the module's eval forward,
    in steps of the program's output quantization."""
    program = runtime_method(result.pte_path, method)
    io = result.io_quant_params
    frame0, frame1 = frames(1, *size, seed=99)
    args = [program_input(x, e) for x, e in zip((frame0, frame1), io["inputs"], strict=True)]
    output = io["outputs"][0]
    got = float_output(next(iter(program.execute(args))), output)
    with torch.no_grad():
        want = prepared(frame0, frame1)
    return int(torch.round((got.reshape(want.shape) - want).abs() / output["scale"]).max())


def test_state_dict_holds_learnt_state_only(trained: Trained) -> None:
    """No constant of the capture (the base grid, its batch) is in the checkpoint: parameters
    and fake-quantize state only (etkit-quant's test_qat_shapes loads one into a capture of
    another size)."""
    state = trained.prepared.state_dict()
    learnt = set(trained.model.state_dict())
    assert all(k in learnt or k.startswith("activation_post_process_") for k in state), [
        k for k in state if k not in learnt and not k.startswith("activation_post_process_")
    ]
    assert all(v.dim() <= 1 or k in learnt for k, v in state.items())


def test_trains_on_crops_and_exports_at_the_render_size(trained: Trained, tmp_path: Path) -> None:
    assert trained.losses[-1] < trained.losses[0], trained.losses
    # (verify=False: the program against the module is the test; a QAT export's verdict is
    # test_qat_export's and this file's extended tests')
    result = export_model(
        trained.prepared, frames(1, *RENDER, seed=20), target="xnnpack",
        artifacts_root=tmp_path / "render",
    )  # fmt: skip
    # (The quantized model, report.json's quantized_model_vs_qat_model, has PyTorch's float
    # sampler back in place of the exact one: it may lie a step further off; the program not.)
    assert result.report["qat"]["recalibrated"] is False
    assert _steps_apart(result, trained.prepared, RENDER, "forward") <= 1


@pytest.mark.extended  # two more exports (about 2 min here): the render size above is CI's
def test_exports_at_sizes(trained: Trained, tmp_path: Path) -> None:
    sizes = [RENDER, (96, 128)]
    result = export_model(
        trained.prepared, frames(1, *RENDER, seed=20), target="xnnpack", verify=True,
        sizes=sizes, artifacts_root=tmp_path / "sizes",
    )  # fmt: skip
    assert result.verification is not None
    assert result.verification["verdict"]["result"] == "pass"
    for method, size in (("forward", RENDER), ("forward_96x128", (96, 128))):
        assert _steps_apart(result, trained.prepared, size, method) <= 1


@pytest.mark.extended
def test_exports_at_a_range(trained: Trained, tmp_path: Path) -> None:
    result = export_model(
        trained.prepared, frames(1, *RENDER, seed=20), target="xnnpack", verify=True,
        dynamic_size=RANGE, artifacts_root=tmp_path / "range",
    )  # fmt: skip
    assert result.verification is not None
    assert result.verification["verdict"]["result"] == "pass"
    for size in ((64, 96), (96, 128), (112, 160), RENDER):
        assert _steps_apart(result, trained.prepared, size, "forward") <= 1


class FixedBatch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image).view(1, 3, 8, 8).tanh()  # batch 1, always


def test_bad_input_gets_one_line(trained: Trained) -> None:
    def one_line(error: pytest.ExceptionInfo[BaseException], pattern: str) -> None:
        text = str(error.value)
        assert "\n" not in text and re.fullmatch(pattern, text), text

    prepared = trained.prepared
    with pytest.raises(ValueError) as caught:  # a crop outside the prepared range
        prepared(*frames(2, 160, 96, 1))
    one_line(caught, r"the prepared module's forward: input frame0 is 2 x 3 x 160 x 96: its "
             r"height 160 is outside 64\.\.144 \(multiples of 16\), the heights the module was "
             r"prepared for; prepare it with a range that covers it")  # fmt: skip
    with pytest.raises(ValueError) as caught:  # the export checks its sizes before any work
        export_model(prepared, frames(1, *RENDER, seed=1), target="xnnpack",
                     sizes=[RENDER, (160, 256)])  # fmt: skip
    one_line(caught, r"the model cannot take size 160x256: .*height 160 is outside 64\.\.144.*")
    with pytest.raises(SizeError) as caught:  # a range the example is not in
        qat_prepare(trained.model, frames(1, 32, 48, 1), target="xnnpack", dynamic_size=RANGE)
    one_line(caught, r"size range 64-144x96-256/16: the example inputs' size 32x48 is not in the "
             r"range .*")  # fmt: skip

    demo, example = flow_warp()  # its linspace fixes the size
    with pytest.raises(SizeError) as caught:  # a model that fixes the size asked dynamic
        qat_prepare(demo, example, target="xnnpack", sizes=[(64, 96)])
    one_line(caught, r"the model cannot take dynamic sizes \(32-64x48-96\): the model's code "
             r"fixes a dynamic size to 32 at demos\.py:\d+ in pixel_grid: .*; prepare it without "
             r"sizes or dynamic_size .*")  # fmt: skip

    image = torch.rand(1, 3, 8, 8)
    with pytest.raises(SizeError) as caught:  # a model that fixes its batch
        qat_prepare(FixedBatch(), (image,), target="xnnpack", calibration=[(image,)])
    one_line(caught, r"the model cannot train on a dynamic batch: .*; prepare it with "
             r"dynamic_batch=False .*")  # fmt: skip
    fixed = qat_prepare(FixedBatch(), (image,), target="xnnpack", calibration=[(image,)],
                        dynamic_batch=False)  # fmt: skip
    with pytest.raises(ValueError) as caught:  # a batch it cannot take
        fixed(torch.rand(2, 3, 8, 8))
    one_line(caught, r"the prepared module's forward: input image is 2 x 3 x 8 x 8: its batch 2 "
             r"is not 1, the only batch the module was prepared for .*")  # fmt: skip

    other = {**prepared.state_dict(), "flow.0.weight": torch.zeros(32, 6, 3, 3)}
    with pytest.raises(ValueError) as caught:  # a checkpoint of another preparation
        check_checkpoint(prepared, other, "other.pt")
    one_line(caught, r"QAT checkpoint other.pt does not match the prepared model: "
             r"'flow.0.weight' has shape \[32, 6, 3, 3\] there but \[16, 6, 3, 3\] .*")  # fmt: skip
