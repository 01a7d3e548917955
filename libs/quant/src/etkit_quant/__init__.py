"""etkit-quant: quantization annotation wrappers, qspec presets and the FX graph queries
that the other etkit libraries share (what is a quantize, a dequantize, a grid sampler)."""

from etkit_quant.graph import (
    DEQUANTIZE_TARGET_NAMES,
    GRID_SAMPLER_TARGET_NAMES,
    QUANTIZE_TARGET_NAMES,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    target_name,
)

__version__ = "0.1.0"

__all__ = [
    "DEQUANTIZE_TARGET_NAMES",
    "GRID_SAMPLER_TARGET_NAMES",
    "QUANTIZE_TARGET_NAMES",
    "__version__",
    "is_dequantize",
    "is_grid_sampler",
    "is_quantize",
    "target_name",
]
