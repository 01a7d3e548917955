"""The Arm backend's interfaces that putting etkit's sampler into a VGF needs, in one place.

Some of them are private to ExecuTorch (the ``_passes`` package and its registry of pass
insertions, which the VGF backend itself uses to insert its own grid-sampler passes). They are
imported only here, only for the ExecuTorch versions this was written against; any other
version gets a clear error naming what to do, instead of a wrong program.
"""

from __future__ import annotations

from typing import Any, Final

SUPPORTED_EXECUTORCH: Final = ("1.5.",)


class ArmInterfaceError(RuntimeError):
    """The installed ExecuTorch does not offer the Arm interfaces this module was written for."""


def executorch_version() -> str:
    from executorch.version import __version__

    return str(__version__)


def check_version() -> None:
    """Raises ``ArmInterfaceError`` unless the installed ExecuTorch is one whose Arm-backend
    interfaces (pass insertions, TOSA CUSTOM, fake-op registry) this module was written for."""
    version = executorch_version()
    if not version.startswith(SUPPORTED_EXECUTORCH):
        raise ArmInterfaceError(
            f"etkit's in-VGF grid sampler was written against ExecuTorch "
            f"{', '.join(v + 'x' for v in SUPPORTED_EXECUTORCH)} Arm-backend interfaces; "
            f"ExecuTorch {version} is installed. Export with sampler_delegate=True "
            "(--sampler-delegate) to keep samplers in etkit's own delegate, or install a "
            "supported ExecuTorch"
        )


def interfaces() -> dict[str, Any]:
    """The Arm-backend objects the in-VGF sampler uses, by name (after ``check_version``)."""
    check_version()
    try:
        from executorch.backends.arm._passes import (
            EnsureUniqueOutputNodesPass,
            InsertRescaleInt32Pass,
        )
        from executorch.backends.arm._passes.arm_pass import ArmPass
        from executorch.backends.arm._passes.arm_pass_manager import (
            _registered_pass_insertions,
            register_pass_insertions_after,
            register_pass_insertions_before,
        )
        from executorch.backends.arm._passes.arm_pass_utils import create_node
        from executorch.backends.arm._passes.fold_qdq_with_annotated_qparams_pass import (
            get_input_qparams,
            get_output_qparams,
        )
        from executorch.backends.arm.tosa.dialect.ops.custom import (
            has_fake_tosa_impl,
            register_fake_tosa,
        )
        from executorch.backends.transforms.utils import create_constant_placeholder
    except ImportError as error:
        raise ArmInterfaceError(
            f"ExecuTorch {executorch_version()} lacks an Arm-backend interface etkit's in-VGF "
            f"grid sampler uses ({error}); export with sampler_delegate=True "
            "(--sampler-delegate)"
        ) from error
    return {
        "ArmPass": ArmPass,
        "InsertRescaleInt32Pass": InsertRescaleInt32Pass,
        "EnsureUniqueOutputNodesPass": EnsureUniqueOutputNodesPass,
        "register_pass_insertions_after": register_pass_insertions_after,
        "registered_pass_insertions": _registered_pass_insertions,
        "register_pass_insertions_before": register_pass_insertions_before,
        "create_node": create_node,
        "get_input_qparams": get_input_qparams,
        "get_output_qparams": get_output_qparams,
        "register_fake_tosa": register_fake_tosa,
        "has_fake_tosa_impl": has_fake_tosa_impl,
        "create_constant_placeholder": create_constant_placeholder,
    }
