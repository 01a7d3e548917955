"""The export targets and the TOSA specification VGF lowers to by default, named once here, in
the lowest layer: the command line builds its parser from them without importing ExecuTorch
(seconds; ``etkit-export --help`` answers without it)."""

from typing import Final

TARGETS: Final = ("vgf", "xnnpack")


VGF_TOSA_SPEC: Final = "TOSA-1.0+INT+FP+int16"
