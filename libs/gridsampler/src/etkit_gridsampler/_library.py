"""Loads the native library (the C++ kernel and the ExecuTorch runtime backend), once."""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache


class CQParams(ctypes.Structure):
    """``EtkitQParams`` of native_api.h."""

    _fields_ = [
        ("scale", ctypes.c_double),
        ("zero_point", ctypes.c_int32),
        ("quant_min", ctypes.c_int32),
        ("quant_max", ctypes.c_int32),
    ]


class NativeLibraryError(RuntimeError):
    """The native library is missing (the package was not built) or could not be loaded."""


@cache
def native_library() -> ctypes.CDLL:
    """The loaded native library, with its C API typed. It links to executorch's
    ``libexecutorch.so``, so ``executorch.runtime`` is imported first: both then share one
    backend registry."""
    import executorch.runtime  # noqa: F401  (loads libexecutorch.so the way the runtime does)

    spec = importlib.util.find_spec("etkit_gridsampler._native")
    if spec is None or spec.origin is None:
        raise NativeLibraryError(
            "etkit-gridsampler's native library is not built; reinstall the package: "
            "pip install --no-build-isolation ./libs/gridsampler (scripts/setup.sh does)"
        )
    try:
        library = ctypes.CDLL(spec.origin, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise NativeLibraryError(f"cannot load {spec.origin}: {error}") from error
    i64p = ctypes.POINTER(ctypes.c_int64)
    library.etkit_gridsampler_register_backend.restype = ctypes.c_int
    library.etkit_gridsampler_register_backend.argtypes = []
    library.etkit_gridsampler_grid_sample_f32.restype = ctypes.c_int
    library.etkit_gridsampler_grid_sample_f32.argtypes = [
        ctypes.c_void_p, i64p, i64p,
        ctypes.c_void_p, i64p, i64p,
        ctypes.c_void_p, i64p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    qp = ctypes.POINTER(CQParams)
    errp = ctypes.POINTER(ctypes.c_char_p)
    library.etkit_gridsampler_grid_sample_q.restype = ctypes.c_int
    library.etkit_gridsampler_grid_sample_q.argtypes = [
        ctypes.c_void_p, i64p, i64p,
        ctypes.c_void_p, ctypes.c_int, i64p, i64p,
        ctypes.c_void_p, i64p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int,
        qp, qp, qp, ctypes.c_int, ctypes.c_int, errp,
    ]  # fmt: skip
    library.etkit_gridsampler_grid_sample_q_float_grid.restype = ctypes.c_int
    library.etkit_gridsampler_grid_sample_q_float_grid.argtypes = (
        library.etkit_gridsampler_grid_sample_q.argtypes
    )
    library.etkit_gridsampler_quantize_grid.restype = ctypes.c_int
    library.etkit_gridsampler_quantize_grid.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, qp, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
    ]  # fmt: skip
    library.etkit_gridsampler_best_isa.restype = ctypes.c_int
    library.etkit_gridsampler_best_isa.argtypes = []
    library.etkit_gridsampler_cpu_supports.restype = ctypes.c_int
    library.etkit_gridsampler_cpu_supports.argtypes = [ctypes.c_int]
    library.etkit_gridsampler_default_num_threads.restype = ctypes.c_int
    library.etkit_gridsampler_default_num_threads.argtypes = []
    library.etkit_gridsampler_plan.restype = ctypes.c_int
    library.etkit_gridsampler_plan.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, qp, qp, ctypes.c_int, qp,
        ctypes.c_int64, ctypes.c_int64, i64p, ctypes.POINTER(ctypes.c_float), errp,
    ]  # fmt: skip
    library.etkit_gridsampler_validate_blob.restype = ctypes.c_int
    library.etkit_gridsampler_validate_blob.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_char_p),
    ]
    return library
