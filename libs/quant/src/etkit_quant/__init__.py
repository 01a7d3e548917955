"""etkit-quant: quantization for image models that a GPU reads and writes directly.

- qspec presets with fixed parameters: ``snorm8``, ``snorm16``, ``unorm8``, ``qformat``, ``fixed``,
  ``fixed_scale``, ``covering``, and ``fixed_qparams`` to read them back; ``observed_int8``;
  ``describe_qspec``;
- ``BoundaryQuantizer``: per-input, per-output and per-grid-sampler quantization on top of any
  PT2E quantizer;
- ``quantize``: export, prepare, calibrate (over many samples), convert;
- ``normalize_program``: a library-built graph made to look hand-written before quantization;
- ``observer_states`` / ``load_observer_states``: one calibration serving other input sizes;
- ``etkit_quant.calibration``: calibration samples checked (``samples``), value ranges observed
  in the float graph (``ranges``), boundary qspecs chosen from them (``defaults``), saturation
  reported (``saturation``), int8's cost to sampling positions (``positions``);
- ``etkit_quant.graph``: the FX graph queries the other etkit libraries share.
"""

from etkit_quant.boundary import (
    ANNOTATION_KEY,
    ARM_ANNOTATION_INFO_KEY,
    COORDINATE_ARITHMETIC,
    GRID_MATHS,
    USER_CHOICE,
    BoundaryQuantizer,
    float_reason,
    own_constants,
    user_inputs,
    user_outputs,
)
from etkit_quant.calibration import (
    POSITION_TOLERANCE_PX,
    SATURATION_THRESHOLD,
    DefaultQSpecs,
    ObservedRange,
    RangeObservation,
    Saturation,
    boundary_fixed_qspecs,
    check_calibration,
    clipping_report,
    coordinate_position_error,
    default_qspec,
    default_qspecs,
    grid_qspec,
    observe_ranges,
    saturation,
    saturation_report,
    value_qspec,
)
from etkit_quant.gather_positions import coordinate_graph_inputs, is_index_gather
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
    is_shape_op,
    operator_name,
    target_name,
    tensor_value,
    value_source,
)
from etkit_quant.normalize import NormalizationReport, normalize_program
from etkit_quant.observers import (
    ObserverState,
    ObserverStates,
    load_observer_states,
    observer_states,
)
from etkit_quant.patching import PatchedWhileEntered
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
from etkit_quant.requantize import per_tensor_parameters, same_parameters
from etkit_quant.samples import ReferenceFor

__version__ = "0.1.0"

__all__: list[str] = [
    "ANNOTATION_KEY",
    "ARM_ANNOTATION_INFO_KEY",
    "COORDINATE_ARITHMETIC",
    "DEQUANTIZE_TARGET_NAMES",
    "GRID_MATHS",
    "GRID_SAMPLER_TARGET_NAMES",
    "POSITION_TOLERANCE_PX",
    "QUANTIZE_TARGET_NAMES",
    "SATURATION_THRESHOLD",
    "USER_CHOICE",
    "BoundaryQuantizer",
    "DefaultQSpecs",
    "FixedQParams",
    "FixedQParamsObserverFactory",
    "NormalizationReport",
    "ObservedRange",
    "ObserverState",
    "ObserverStates",
    "PatchedWhileEntered",
    "RangeObservation",
    "ReferenceFor",
    "Saturation",
    "__version__",
    "boundary_fixed_qspecs",
    "check_calibration",
    "clipping_report",
    "compute_kind",
    "coordinate_graph_inputs",
    "coordinate_inputs",
    "coordinate_nodes",
    "coordinate_position_error",
    "covering",
    "default_qspec",
    "default_qspecs",
    "describe_qspec",
    "fixed",
    "fixed_qparams",
    "fixed_scale",
    "float_reason",
    "grid_position_nodes",
    "grid_qspec",
    "is_coordinate_op",
    "is_dequantize",
    "is_fixed",
    "is_grid_sampler",
    "is_index_gather",
    "is_quantize",
    "is_shape_op",
    "load_observer_states",
    "normalize_program",
    "observe_ranges",
    "observed_int8",
    "observed_int16",
    "observer_states",
    "operator_name",
    "own_constants",
    "per_tensor_parameters",
    "qformat",
    "quantize",
    "same_parameters",
    "saturation",
    "saturation_report",
    "snorm8",
    "snorm16",
    "target_name",
    "tensor_value",
    "unorm8",
    "user_inputs",
    "user_outputs",
    "value_qspec",
    "value_source",
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
