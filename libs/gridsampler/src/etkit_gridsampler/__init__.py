"""etkit-gridsampler: a grid-sampler backend for ExecuTorch with a C++ CPU kernel (also the
runtime backend) and a Vulkan compute kernel."""

from etkit_gridsampler import (
    call_sites,
    cpu,
    delegate_format,
    qat,
    reference,
    runtime,
    torch_kernel,
    vgf_shader,
    vulkan,
)
from etkit_gridsampler.backend import GridSamplerBackend
from etkit_gridsampler.op import GridSampleOp, QParams, dequantize
from etkit_gridsampler.partitioner import GridSamplerPartitioner
from etkit_gridsampler.plan import UnsupportedOpError

__version__ = "0.1.0"

__all__: list[str] = [
    "GridSampleOp",
    "GridSamplerBackend",
    "GridSamplerPartitioner",
    "QParams",
    "UnsupportedOpError",
    "__version__",
    "call_sites",
    "cpu",
    "delegate_format",
    "dequantize",
    "qat",
    "reference",
    "runtime",
    "torch_kernel",
    "vgf_shader",
    "vulkan",
]
