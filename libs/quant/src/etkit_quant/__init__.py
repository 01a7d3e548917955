"""etkit-quant: quantization for image models that a GPU reads and writes directly.

- qspec presets with fixed parameters: ``snorm8``, ``snorm16``, ``unorm8``, ``qformat``, ``fixed``,
  ``fixed_scale``, ``covering``, and ``fixed_qparams`` to read them back; ``observed_int8``;
  ``describe_qspec``;
- ``BoundaryQuantizer``: per-input, per-output and per-grid-sampler quantization on top of any
  PT2E quantizer;
- ``quantize``: export, prepare, calibrate (over many samples), convert;
- ``observer_states`` / ``load_observer_states``: one calibration serving other input sizes;
- ``etkit_quant.calibration``: calibration samples checked (``samples``), value ranges observed
  in the float graph (``ranges``), boundary qspecs chosen from them (``defaults``), saturation
  reported (``saturation``), int8's cost to sampling positions (``positions``);
- ``etkit_quant.graph``: the FX graph queries the other etkit libraries share.
"""

from etkit_quant.boundary import BoundaryQuantizer, own_constants, user_inputs, user_outputs
from etkit_quant.calibration import (
    SATURATION_THRESHOLD,
    DefaultQSpecs,
    ObservedRange,
    RangeObservation,
    Saturation,
    boundary_fixed_qspecs,
    check_calibration,
    clipping_report,
    default_qspec,
    default_qspecs,
    grid_qspec,
    observe_ranges,
    saturation,
    saturation_report,
    value_qspec,
)
from etkit_quant.gather_positions import coordinate_graph_inputs
from etkit_quant.graph import (
    DEQUANTIZE_TARGET_NAMES,
    GRID_SAMPLER_TARGET_NAMES,
    QUANTIZE_TARGET_NAMES,
    compute_kind,
    coordinate_inputs,
    coordinate_nodes,
    grid_position_nodes,
    is_coordinate_op,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    operator_name,
    target_name,
)
from etkit_quant.observers import (
    ObserverState,
    ObserverStates,
    load_observer_states,
    observer_states,
)
from etkit_quant.qspecs import (
    FixedQParams,
    FixedQParamsObserverFactory,
    covering,
    describe_qspec,
    fixed,
    fixed_qparams,
    fixed_scale,
    is_fixed,
    observed_int8,
    observed_int16,
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
    "SATURATION_THRESHOLD",
    "BoundaryQuantizer",
    "DefaultQSpecs",
    "FixedQParams",
    "FixedQParamsObserverFactory",
    "ObservedRange",
    "ObserverState",
    "ObserverStates",
    "RangeObservation",
    "Saturation",
    "__version__",
    "boundary_fixed_qspecs",
    "check_calibration",
    "clipping_report",
    "compute_kind",
    "coordinate_graph_inputs",
    "coordinate_inputs",
    "coordinate_nodes",
    "covering",
    "default_qspec",
    "default_qspecs",
    "describe_qspec",
    "fixed",
    "fixed_qparams",
    "fixed_scale",
    "grid_position_nodes",
    "grid_qspec",
    "is_coordinate_op",
    "is_dequantize",
    "is_fixed",
    "is_grid_sampler",
    "is_quantize",
    "load_observer_states",
    "observe_ranges",
    "observed_int8",
    "observed_int16",
    "observer_states",
    "operator_name",
    "own_constants",
    "qformat",
    "quantize",
    "saturation",
    "saturation_report",
    "snorm8",
    "snorm16",
    "target_name",
    "unorm8",
    "user_inputs",
    "user_outputs",
    "value_qspec",
]

# Quantization-aware training (qat.py): prepare, train, convert; grid-sampler replacement hook.
from etkit_quant.qat import (
    QatGraphModule,
    QatGridSampler,
    SamplerReplacement,
    convert_qat,
    fake_quant_params,
    prepare_qat,
    prepared_grid_samplers,
    replace_grid_samplers,
)

__all__ += [
    "QatGraphModule",
    "QatGridSampler",
    "SamplerReplacement",
    "convert_qat",
    "fake_quant_params",
    "prepare_qat",
    "prepared_grid_samplers",
    "replace_grid_samplers",
]
