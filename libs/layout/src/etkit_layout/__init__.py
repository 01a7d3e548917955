"""etkit-layout: FX graph passes on image layout (RGB to RGBA padding, channels-last)
for ExecuTorch programs."""

__version__ = "0.1.0"

__all__ = ["__version__"]
