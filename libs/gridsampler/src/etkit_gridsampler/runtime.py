"""The grid-sampler backend inside ``executorch.runtime``."""

from __future__ import annotations

from etkit_gridsampler._library import native_library

BACKEND_ID = "GridSamplerBackend"


def register() -> str:
    """Registers the C++ grid-sampler backend with the ExecuTorch runtime of this process, so
    that ``executorch.runtime.Runtime`` loads programs whose delegates name it. Idempotent.
    Returns the backend id. Raises ``RuntimeError`` if the runtime refuses the registration."""
    status = native_library().etkit_gridsampler_register_backend()
    if status != 0:
        raise RuntimeError(f"registering {BACKEND_ID} failed with executorch error code {status}")
    return BACKEND_ID


def is_registered() -> bool:
    """True when the ExecuTorch runtime of this process lists the backend."""
    from executorch.runtime import Runtime

    return BACKEND_ID in Runtime.get().backend_registry.registered_backend_names


def validate_blob(blob: bytes) -> None:
    """Validates a delegate blob with the C++ parser the backend runs at ``init`` (the rules of
    docs/delegate_format.md). ``init`` also plans the integer contract, which may still refuse a
    valid blob (``plan.unsupported_reason`` says when). Raises ``DelegateFormatError`` with the
    runtime's message when the parser refuses the blob."""
    import ctypes

    from etkit_gridsampler.delegate_format import DelegateFormatError

    error = ctypes.c_char_p()
    if native_library().etkit_gridsampler_validate_blob(blob, len(blob), ctypes.byref(error)):
        message = error.value.decode() if error.value else "invalid blob"
        raise DelegateFormatError(message)
