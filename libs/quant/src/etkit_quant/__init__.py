"""etkit-quant: quantization for image models that a GPU reads and writes directly.

- qspec presets with fixed parameters: ``snorm8``, ``snorm16``, ``unorm8``, ``qformat``, ``fixed``,
  and ``fixed_qparams`` to read them back;
- ``BoundaryQuantizer``: per-input, per-output and per-grid-sampler quantization on top of any
  PT2E quantizer;
- ``quantize``: export, prepare, calibrate, convert;
- ``etkit_quant.graph``: the FX graph queries the other etkit libraries share.
"""

from etkit_quant.boundary import BoundaryQuantizer, user_inputs, user_outputs
from etkit_quant.graph import (
    DEQUANTIZE_TARGET_NAMES,
    GRID_SAMPLER_TARGET_NAMES,
    QUANTIZE_TARGET_NAMES,
    grid_position_nodes,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    operator_name,
    target_name,
)
from etkit_quant.qspecs import (
    FixedQParams,
    FixedQParamsObserverFactory,
    fixed,
    fixed_qparams,
    qformat,
    snorm8,
    snorm16,
    unorm8,
)
from etkit_quant.quantize import quantize

__version__ = "0.1.0"

__all__ = [
    "DEQUANTIZE_TARGET_NAMES",
    "GRID_SAMPLER_TARGET_NAMES",
    "QUANTIZE_TARGET_NAMES",
    "BoundaryQuantizer",
    "FixedQParams",
    "FixedQParamsObserverFactory",
    "__version__",
    "fixed",
    "fixed_qparams",
    "grid_position_nodes",
    "is_dequantize",
    "is_grid_sampler",
    "is_quantize",
    "operator_name",
    "qformat",
    "quantize",
    "snorm8",
    "snorm16",
    "target_name",
    "unorm8",
    "user_inputs",
    "user_outputs",
]
