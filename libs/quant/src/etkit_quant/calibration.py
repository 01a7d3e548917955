"""Calibration over many samples, and honest boundary quantization chosen from the data. The
names live in one module per idea and are all importable from here (and from ``etkit_quant``):

- ``etkit_quant.samples``: ``check_calibration``, every sample checked before any work (a tuple
  of tensors with the example inputs' count, shapes and dtypes, finite values); ``OnSample``;
- ``etkit_quant.ranges``: ``observe_ranges``, the float graph run on every sample
  (``torch.fx.Interpreter``; the graph is not modified), recording min, max and count of the
  values at each graph input, graph output and grid sampler (image, grid, output), and exactly
  how many lie outside given ranges (``ObservedRange``, ``RangeObservation``);
- ``etkit_quant.positions``: ``coordinate_position_error``, how far rounding the tensors entering
  the coordinate arithmetic to int8 moves the sampling positions (``POSITION_TOLERANCE_PX``);
- ``etkit_quant.defaults``: ``default_qspecs``, each boundary's qspec chosen from those ranges
  (the rule is in its docstring and the guide, docs/libraries/quant-guide.md);
- ``etkit_quant.saturation``: ``saturation`` / ``saturation_report``, for every fixed-parameter
  qspec at a boundary or grid sampler, the fraction of calibration values outside its
  representable range, with the covering qspec to use instead when it is past
  ``SATURATION_THRESHOLD``; ``clipping_report``, the same inside a converted graph.
"""

from etkit_quant.defaults import (
    SNORM8_MIN_ABS,
    DefaultQSpecs,
    default_qspec,
    default_qspecs,
    grid_qspec,
    value_qspec,
)
from etkit_quant.positions import POSITION_TOLERANCE_PX, coordinate_position_error
from etkit_quant.ranges import ObservedRange, RangeObservation, SiteKind, observe_ranges
from etkit_quant.samples import OnSample, check_calibration
from etkit_quant.saturation import (
    SATURATION_THRESHOLD,
    Saturation,
    boundary_fixed_qspecs,
    clipping_report,
    saturation,
    saturation_report,
)

__all__ = [
    "POSITION_TOLERANCE_PX",
    "SATURATION_THRESHOLD",
    "SNORM8_MIN_ABS",
    "DefaultQSpecs",
    "ObservedRange",
    "OnSample",
    "RangeObservation",
    "Saturation",
    "SiteKind",
    "boundary_fixed_qspecs",
    "check_calibration",
    "clipping_report",
    "coordinate_position_error",
    "default_qspec",
    "default_qspecs",
    "grid_qspec",
    "observe_ranges",
    "saturation",
    "saturation_report",
    "value_qspec",
]
