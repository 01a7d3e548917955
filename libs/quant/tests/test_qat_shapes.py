"""``prepare_qat`` with dynamic dimensions (issue 55): a module captured with a dynamic batch and
height/width range trains on any batch and size in it, refuses others in one line before any
work, keeps no constant of the capture in its state dict, and ``convert_qat(example_inputs=...)``
folds what the graph computes from the sizes at one size, with the values of the dynamic
graph."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from quant_models import FlowWarp, rand
from torch.export import Dim

from etkit_quant import BoundaryQuantizer, QatGraphModule, convert_qat, prepare_qat, snorm8
from etkit_quant.qat_shapes import SizeRange


class ShapeGridWarp(torch.nn.Module):
    """A base grid built from the input's batch, height and width in tensor ops."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = torch.nn.Conv2d(6, 2, 3, padding=1)

    def forward(self, frame0: torch.Tensor, frame1: torch.Tensor) -> torch.Tensor:
        n, _, height, width = frame0.shape
        ys = torch.arange(height, dtype=torch.float32) * 2 / (height - 1) - 1
        xs = torch.arange(width, dtype=torch.float32) * 2 / (width - 1) - 1
        base = torch.stack(
            (
                xs.view(1, 1, -1).expand(n, height, width),
                ys.view(1, -1, 1).expand(n, height, width),
            ),
            -1,
        )
        flow = self.flow(torch.cat([frame0, frame1], 1)).permute(0, 2, 3, 1) * 0.1
        return F.grid_sample(frame0, base + flow, padding_mode="border", align_corners=False)


def quantizer() -> BoundaryQuantizer:
    base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
    return BoundaryQuantizer(base, input_qspecs=(snorm8(), snorm8()), output_qspecs=(snorm8(),))


def pair(batch: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rand(batch, 3, height, width), rand(batch, 3, height, width)


def dynamic() -> tuple[dict[int, object], dict[int, object]]:
    batch = Dim("batch", min=1, max=8)
    height = 8 * Dim("h8", min=2, max=4)
    width = 8 * Dim("w8", min=2, max=6)
    dims = {0: batch, 2: height, 3: width}
    return dims, dims


@pytest.fixture(scope="module")
def prepared() -> QatGraphModule:
    torch.manual_seed(0)
    return prepare_qat(
        ShapeGridWarp().eval(), pair(2, 16, 24), quantizer(),
        calibration=[pair(2, 16, 24), pair(1, 24, 32)], dynamic_shapes=dynamic(),
    )  # fmt: skip


def test_trains_on_any_batch_and_size_in_the_range(prepared: QatGraphModule) -> None:
    prepared = copy.deepcopy(prepared)  # (the next test's stays untrained)
    shapes = prepared.meta["etkit_qat_input_shapes"]
    assert shapes.names == ("frame0", "frame1")
    assert shapes.shapes[0] == (SizeRange(1, 8), 3, SizeRange(16, 32, 8), SizeRange(16, 48, 8))
    # Only learnt state: the base grid the capture computes from the sizes is no buffer of it.
    learnt = set(ShapeGridWarp().state_dict())
    assert all(
        k in learnt or k.startswith("activation_post_process_") for k in prepared.state_dict()
    )
    optimizer = torch.optim.Adam(prepared.parameters(), lr=1e-3)
    for batch, height, width in ((4, 16, 24), (1, 32, 48), (3, 24, 16)):
        frame0, frame1 = pair(batch, height, width)
        loss = F.l1_loss(prepared(frame0, frame1), frame1)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    prepared.eval()
    for size in ((1, 16, 24), (2, 32, 40)):
        inputs = pair(*size)
        with torch.no_grad():
            want = prepared(*inputs)
            dynamic_model = convert_qat(prepared)(*inputs)
            folded = convert_qat(prepared, example_inputs=inputs)
            got = folded(*inputs)
        # Folded at that size: nothing reads the sizes any more, and the values are the same.
        assert not [n for n in folded.graph.nodes if "sym_size" in str(n.target)]
        assert not [n for n in folded.graph.nodes if "arange" in str(n.target)]
        assert torch.equal(got, dynamic_model)
        assert float((got - want).abs().max()) <= (1 / 127) * (1 + 1e-3)


def test_shapes_outside_the_capture_get_one_line(prepared: QatGraphModule) -> None:
    cases = [
        (pair(2, 20, 24), r"input frame0 is 2 x 3 x 20 x 24: its height 20 is outside 16\.\.32 "
                          r"\(multiples of 8\), the heights the module was prepared for; .*"),
        (pair(9, 16, 24), r"input frame0 is 9 x 3 x 16 x 24: its batch 9 is outside 1\.\.8, .*"),
        ((rand(2, 3, 16, 24),), r"the prepared module takes 2 inputs \(frame0, frame1\), got 1"),
    ]  # fmt: skip
    for inputs, pattern in cases:
        with pytest.raises(ValueError) as caught:
            prepared(*inputs)
        text = str(caught.value)
        assert "\n" not in text
        assert re.fullmatch(r"the prepared module's forward: " + pattern, text), text
    with pytest.raises(ValueError, match=r"^calibration sample 1: input frame0 is 1 x 3 x 64 x"):
        prepare_qat(
            ShapeGridWarp().eval(), pair(2, 16, 24), quantizer(),
            calibration=[pair(2, 16, 24), pair(1, 64, 24)], dynamic_shapes=dynamic(),
        )  # fmt: skip


def test_fixed_capture_keeps_folded_constants_out_of_the_state_dict() -> None:
    """Captured at one size, the base grid is folded (a constant of the graph, ``_folded_N``),
    and is no part of the state dict: a checkpoint from a capture at 16 x 16 loads into one at
    24 x 32 by name and shape."""
    torch.manual_seed(2)
    model = FlowWarp().eval()
    small = prepare_qat(model, pair(1, 16, 16), quantizer(), calibration=[pair(1, 16, 16)])
    assert any(name.startswith("_folded_") for name, _ in small.named_buffers())
    assert not [k for k in small.state_dict() if k.startswith(("_folded_", "_tensor_constant"))]
    large = prepare_qat(model, pair(1, 24, 32), quantizer(), calibration=[pair(1, 24, 32)])
    large.load_state_dict(small.state_dict(), strict=True)
    with pytest.raises(ValueError, match=r"its height 16 is not 24, the only height .*"):
        large(*pair(1, 16, 32))
