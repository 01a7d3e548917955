"""A Python interpreter of ExecuTorch ``.pte`` files with substitutable delegates.

ExecuTorch's pip runtime cannot run ``VgfBackend`` delegates, so a VGF program is never run as a
whole there. This runner reads the program from the ``.pte`` bytes (what ships, not the
in-memory edge program) with ExecuTorch's own deserializer, builds the method's values table
(planned tensors in byte arenas as the memory plan lays them out, dim order included; constants;
scalars; lists) and executes the chain's instructions in order:

- kernel calls through their PyTorch operators (``aten::add.out`` ->
  ``torch.ops.aten.add.out``), ExecuTorch's quantized kernels
  (``quantized_decomposed::*.out``, loaded from ``executorch.kernels.quantized``, the very
  kernels of the runtime) and ``dim_order_ops::*``; ``executorch_prim::*`` (symbolic-size
  arithmetic, ``et_view``) interpreted here;
- delegate calls through a registry keyed by backend id: ``GridSamplerBackend``
  (``etkit_gridsampler``'s CPU or Vulkan kernel), ``VgfBackend`` (``scenario_runner`` on the
  Vulkan device with the ML emulation layers), or any Python function registered for a backend
  id;
- moves, conditional jumps and frees as the runtime does.

```python
from etkit_exporter.runner import PteProgram

program = PteProgram.load("artifacts/flow-warp/model.pte", grid_sampler_impl="cpu")
program.method_names                 # ('forward', 'input0_scale', ...)
program.delegates                    # backend id, index, size, instructions of each
result = program.run([frame0_q, frame1_q], keep_values=True)
result.outputs, result.delegate_calls, result.warnings, result.values
```
"""

from etkit_exporter.runner.delegates import (
    GRID_SAMPLER_BACKEND,
    VGF_BACKEND,
    DelegateCall,
    DelegateFn,
    GridSamplerImpl,
)
from etkit_exporter.runner.engine import (
    DelegateCallRecord,
    KernelCallRecord,
    RunResult,
    ValueRecord,
)
from etkit_exporter.runner.errors import (
    ExecutionError,
    ProgramInputError,
    PteError,
    PteFormatError,
    UnsupportedProgramError,
)
from etkit_exporter.runner.kernels import resolve as resolve_operator
from etkit_exporter.runner.model import (
    DelegateInfo,
    ListInfo,
    MethodInfo,
    ScalarInfo,
    TensorInfo,
    ValueInfo,
)
from etkit_exporter.runner.program import PteProgram

__all__ = [
    "GRID_SAMPLER_BACKEND",
    "VGF_BACKEND",
    "DelegateCall",
    "DelegateCallRecord",
    "DelegateFn",
    "DelegateInfo",
    "ExecutionError",
    "GridSamplerImpl",
    "KernelCallRecord",
    "ListInfo",
    "MethodInfo",
    "ProgramInputError",
    "PteError",
    "PteFormatError",
    "PteProgram",
    "RunResult",
    "ScalarInfo",
    "TensorInfo",
    "UnsupportedProgramError",
    "ValueInfo",
    "ValueRecord",
    "resolve_operator",
]
