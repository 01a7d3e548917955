"""etkit's grid sampler as a VGF compute segment, without a VGF: the payload names exactly the
shader's bindings, the check refuses every mismatch the toolchain would let through silently,
and both ways of carrying the parameter block (constant tensor, baked shader) give the CPU
kernel's bits when the shader is dispatched as the payload describes it."""

from __future__ import annotations

import base64
import copy
from typing import Any

import numpy as np
import pytest
import torch

from etkit_gridsampler import GridSampleOp, QParams, cpu
from etkit_gridsampler._vulkan_compute import default_device
from etkit_gridsampler.vgf_shader import (
    PayloadError,
    TensorSpec,
    build_segment,
    byte_size_reason,
    padded_channels,
    reflect,
    sampler_lowering,
    validate,
)

SNORM8 = QParams(1 / 127, 0, -127, 127, torch.int8)
GRID16 = QParams(2 / 32767, 0, -32767, 32767, torch.int16)
OP = GridSampleOp("bilinear", "border", False, SNORM8, GRID16, SNORM8)


def _payload_parts(mode: str) -> tuple[dict[str, Any], tuple[TensorSpec, ...], TensorSpec]:
    segment = build_segment(OP, (1, 4, 8, 12), (1, 6, 10, 2), params_mode=mode)  # type: ignore[arg-type]
    return copy.deepcopy(segment.payload), segment.inputs, segment.output


@pytest.mark.parametrize("mode", ["tensor", "baked"])
def test_payload_binds_every_shader_binding_as_a_storage_buffer(mode: str) -> None:
    payload, inputs, output = _payload_parts(mode)
    shader = reflect(base64.b64decode(payload["shader_code"]))
    bound = sorted(
        payload[f"{port}_binding"]
        for port in [f"input_{i}" for i in range(len(inputs))] + ["output_0"]
    )
    assert bound == [b.binding for b in shader.bindings]
    assert bound == ([0, 1, 2, 3] if mode == "tensor" else [0, 1, 2])
    assert all(b.descriptor_type == "VK_DESCRIPTOR_TYPE_STORAGE_BUFFER" for b in shader.bindings)
    assert not shader.push_constant_blocks
    assert payload["input_1_vkformat"] == "VK_FORMAT_R16_SINT"  # the int16 grid, kept
    assert inputs[0].shape == (1, 8, 12, 4) and output.shape == (1, 6, 10, 4)  # NHWC


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(push_constants=[1, 2]), "push_constants"),
        (
            lambda p: p.update(input_1_vkdescriptortype="VK_DESCRIPTOR_TYPE_TENSOR_ARM"),
            "TENSOR_ARM",
        ),
        (lambda p: p.update(input_1_vkformat="VK_FORMAT_R8_SINT"), "R8_SINT for a torch.int16"),
        (lambda p: p.update(output_0_binding=5), "lacks"),
        (lambda p: p.update(input_2_binding=1), "share binding"),
        (lambda p: p.update(workgroup_sizes=[2, 1, 1]), "group counts"),
        (lambda p: p.update(entry_point="grid_sample"), "entry point"),
        (lambda p: p.update(shader_code="not base64!"), "base64"),
    ],
)
def test_validate_refuses_what_the_toolchain_would_accept(change: Any, message: str) -> None:
    from etkit_gridsampler import vulkan

    payload, inputs, output = _payload_parts("tensor")
    kernel = vulkan.dispatch((1, 4, 8, 12), (1, 6, 10, 2), OP, channels_last=True)
    validate(payload, inputs, (output,), kernel=kernel)  # as built: accepted
    change(payload)
    with pytest.raises(PayloadError, match=message):
        validate(payload, inputs, (output,), kernel=kernel)


def test_validate_refuses_a_missing_parameter_block_and_odd_byte_sizes() -> None:
    payload, inputs, output = _payload_parts("tensor")
    with pytest.raises(PayloadError, match=r"binding 3 .* bound by no input"):
        validate(payload, inputs[:2], (output,))
    odd = TensorSpec((1, 3, 3, 3), torch.int8)  # 27 bytes
    with pytest.raises(PayloadError, match="27 bytes, not a multiple"):
        validate(payload, (inputs[0], inputs[1], inputs[2]), (odd,))


def test_byte_sizes_not_a_multiple_of_four_are_refused_by_name() -> None:
    assert byte_size_reason((1, 4, 5, 5), (1, 3, 3, 2), torch.int16) is None
    reason = byte_size_reason((1, 1, 5, 5), (1, 3, 3, 2), torch.int16)
    assert reason is not None and "image 25 bytes" in reason and "output 9 bytes" in reason
    with pytest.raises(PayloadError, match="not a multiple of 4"):
        build_segment(OP, (1, 3, 5, 5), (1, 3, 3, 2))


def test_channels_are_padded_to_whole_words_where_that_helps() -> None:
    assert padded_channels((1, 4, 5, 5), (1, 3, 3, 2), torch.int16) == 4  # already whole words
    assert padded_channels((1, 2, 6, 6), (1, 4, 4, 2), torch.int16) == 2  # 72 and 32 bytes
    assert padded_channels((1, 1, 5, 5), (1, 3, 3, 2), torch.int16) == 4  # 25 and 9 bytes
    assert padded_channels((1, 3, 5, 5), (1, 3, 3, 2), torch.int16) == 4
    assert padded_channels((1, 5, 3, 3), (1, 3, 3, 2), torch.int16) == 8
    # an int8 grid of 9 points is 18 bytes: no channel count helps
    assert padded_channels((1, 4, 5, 5), (1, 3, 3, 2), torch.int8) is None


@pytest.mark.parametrize("mode", ["tensor", "baked"])
@pytest.mark.parametrize(
    "op",
    [
        OP,
        GridSampleOp("nearest", "zeros", True, SNORM8, GRID16, SNORM8),
        GridSampleOp("bilinear", "reflection", True, QParams(0.02, 3, -128, 127, torch.int8),
                     QParams(1 / 32767, 0, -32767, 32767, torch.int16),
                     QParams(0.015, -2, -128, 127, torch.int8)),
    ],
)  # fmt: skip
def test_segment_as_described_gives_the_cpu_kernels_bits(mode: str, op: GridSampleOp) -> None:
    """Dispatch the SPIR-V exactly as the payload declares it (its bindings, its group counts,
    the parameter block as the constant tensor's words, no specialization) on lavapipe."""
    rng = np.random.default_rng(7)
    n, c, h, w, ho, wo = 1, 8, 9, 13, 7, 11
    image = torch.from_numpy(rng.integers(-128, 128, (n, h, w, c), dtype=np.int8))
    grid = torch.from_numpy(rng.integers(-40000, 40000, (n, ho, wo, 2)).clip(-32768, 32767)).to(
        torch.int16
    )
    segment = build_segment(op, (n, c, h, w), (n, ho, wo, 2), params_mode=mode)  # type: ignore[arg-type]
    payload = segment.payload
    buffers: dict[int, np.ndarray[Any, Any]] = {
        payload["input_0_binding"]: image.numpy().view(np.uint32).reshape(-1),
        payload["input_1_binding"]: grid.numpy().view(np.uint32).reshape(-1),
        payload["output_0_binding"]: np.zeros(n * ho * wo * c // 4, np.uint32),
    }
    if mode == "tensor":
        buffers[payload["input_2_binding"]] = np.array(segment.params_words, np.int32).view(
            np.uint32
        )
    (result,) = default_device().run(
        base64.b64decode(payload["shader_code"]),
        [buffers[k] for k in sorted(buffers)],
        group_counts=tuple(payload["workgroup_sizes"]),  # type: ignore[arg-type]
        read_back=[payload["output_0_binding"]],
    )
    nchw = image.permute(0, 3, 1, 2)
    expected = cpu.grid_sample(nchw.contiguous(), grid, op).permute(0, 2, 3, 1).contiguous()
    np.testing.assert_array_equal(result.view(np.int8).reshape(n, ho, wo, c), expected.numpy())


def test_other_executorch_versions_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Arm backend's private interfaces are used only on the ExecuTorch they were written
    for; another version gets an error that says what to do, before any lowering."""
    from etkit_gridsampler.vgf_shader import _arm

    monkeypatch.setattr(_arm, "executorch_version", lambda: "1.6.0")
    with pytest.raises(_arm.ArmInterfaceError, match=r"1\.6\.0 is installed.*sampler_delegate"):
        sampler_lowering().__enter__()


def test_sampler_lowering_registers_its_passes_only_while_active() -> None:
    from executorch.backends.arm._passes.arm_pass_manager import _registered_pass_insertions

    def registered() -> list[str]:
        return [
            type(p).__name__
            for insertions in _registered_pass_insertions.values()
            for p in insertions.before_passes + insertions.after_passes
        ]

    before = registered()
    with sampler_lowering():
        inside = registered()
    assert "RewriteEtkitGridSamplerPass" in inside and "FinalizeEtkitSegmentsPass" in inside
    assert registered() == before
