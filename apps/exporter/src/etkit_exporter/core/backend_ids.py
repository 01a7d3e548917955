"""The backend ids of the delegates this app writes and runs, named once."""

from typing import Final

from etkit_gridsampler.runtime import BACKEND_ID

GRID_SAMPLER_BACKEND: Final = BACKEND_ID
# The name of ExecuTorch's Arm VGF backend (executorch.backends.arm.vgf), which lowered programs
# carry; importing the Arm backend to read it would cost seconds.
VGF_BACKEND: Final = "VgfBackend"
