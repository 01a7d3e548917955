"""etkit-layout: FX graph passes on image layout (RGB to RGBA padding, channels-last) for
ExecuTorch programs."""

from etkit_layout.channels_last import channels_last, channels_last_nodes, grid_tensors
from etkit_layout.delegate_layouts import (
    LayoutFix,
    PinResult,
    delegate_layout_mismatches,
    pin_delegate_layouts,
)
from etkit_layout.rgba import pad_rgb_to_rgba

__version__ = "0.1.0"

__all__: list[str] = [
    "LayoutFix",
    "PinResult",
    "__version__",
    "channels_last",
    "channels_last_nodes",
    "delegate_layout_mismatches",
    "grid_tensors",
    "pad_rgb_to_rgba",
    "pin_delegate_layouts",
]
