"""The grid-sampler delegate of a .pte run in etkit_pterunner: the blob
(``etkit_gridsampler.delegate_format``) says which runtime argument is the image and which the
grid; the kernel is ``etkit_gridsampler.cpu.grid_sample`` or, for ``"vulkan"``,
``etkit_gridsampler.vulkan.grid_sample`` (integer ops; a float op runs on the CPU kernel, the
Vulkan kernel being integer-only)."""

from __future__ import annotations

from typing import Final, Literal

from etkit_gridsampler import cpu, vulkan
from etkit_gridsampler.delegate_format import DelegateFormatError, decode
from etkit_pterunner import DelegateCall, DelegateInfo, describe_tensor

GridSamplerImpl = Literal["cpu", "vulkan"]
GRID_SAMPLER_IMPLS: Final = ("cpu", "vulkan")


class GridSamplerDelegate:
    """The grid sampler through etkit_gridsampler's kernels."""

    def __init__(self, impl: GridSamplerImpl = "cpu") -> None:
        if impl not in GRID_SAMPLER_IMPLS:
            raise ValueError(f"grid_sampler_impl must be 'cpu' or 'vulkan', got {impl!r}")
        self.impl: GridSamplerImpl = impl

    label = "built-in (etkit_gridsampler)"

    def num_inputs(self, delegate: DelegateInfo) -> int:
        """The blob's argument roles say how many inputs."""
        return decode(delegate.processed).roles.inputs

    def execute(self, call: DelegateCall) -> str:
        try:
            blob = decode(call.delegate.processed)
        except DelegateFormatError as error:
            raise call.fail(str(error)) from None
        roles = blob.roles
        if len(call.inputs) != roles.inputs or len(call.outputs) != 1:
            raise call.fail(
                f"the blob says {roles.inputs} inputs and 1 output, the program passes "
                f"{len(call.inputs)} and {len(call.outputs)}"
            )
        image, grid = call.inputs[roles.image], call.inputs[roles.grid]
        for role, tensor, bounds in (
            ("image", image, blob.image_bounds()),
            ("grid", grid, blob.grid_bounds()),
        ):  # each dimension within the blob's bounds (equal bounds: a fixed size)
            sizes = tuple(tensor.shape)
            if len(sizes) != len(bounds) or any(
                not low <= size <= high for size, (low, high) in zip(sizes, bounds, strict=False)
            ):
                raise call.fail(
                    f"the {role} (argument {roles.image if role == 'image' else roles.grid}) is "
                    f"{describe_tensor(tensor)}, the blob says shape {_bounds_text(bounds)}"
                )
        op = blob.op
        grid = blob.grid_operand(grid)  # quantized as the delegate does on entry, where it does
        if self.impl == "vulkan" and not op.is_float:
            result = vulkan.grid_sample(image, grid, op)
            used = "etkit_gridsampler.vulkan"
        else:
            result = cpu.grid_sample(image, grid, op)
            used = "etkit_gridsampler.cpu"
            if self.impl == "vulkan":
                used += " (a float op: the Vulkan kernel is integer-only)"
        # a dynamic output (planned at its upper bound) takes the size the kernel computed
        output = call.resize_output(0, result.shape) if blob.is_dynamic else call.outputs[0]
        if result.shape != output.shape or result.dtype != output.dtype:
            raise call.fail(
                f"the kernel gave {describe_tensor(result)}, the program's output is "
                f"{call.output_infos[0].describe()}"
            )
        output.copy_(result)
        return used


def _bounds_text(bounds: tuple[tuple[int, int], ...]) -> str:
    """``[1, 3, 4..64, 4..96]``: a fixed size as itself, a dynamic one as its bounds."""
    return "[" + ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in bounds) + "]"
