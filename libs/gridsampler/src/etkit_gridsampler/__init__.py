"""etkit-gridsampler: a grid-sampler backend for ExecuTorch with a C++ CPU kernel (also the
runtime backend) and a Vulkan compute kernel."""

from etkit_gridsampler import cpu, qat, runtime, torch_kernel, vulkan
from etkit_gridsampler.backend import GridSamplerBackend
from etkit_gridsampler.op import GridSampleOp, QParams
from etkit_gridsampler.partitioner import GridSamplerPartitioner

__version__ = "0.1.0"

__all__ = [
    "GridSampleOp",
    "GridSamplerBackend",
    "GridSamplerPartitioner",
    "QParams",
    "__version__",
    "cpu",
    "qat",
    "runtime",
    "torch_kernel",
    "vulkan",
]
