"""etkit-pterunner: a Python interpreter of ExecuTorch ``.pte`` files with substitutable
delegates.

It reads the program from the ``.pte`` bytes (what ships, not the in-memory edge program) with
ExecuTorch's own deserializer, builds the method's values table (planned tensors in byte arenas
as the memory plan lays them out, dim order included; constants; scalars; lists) and executes
the chain's instructions in order:

- kernel calls through their PyTorch operators (``aten::add.out`` ->
  ``torch.ops.aten.add.out``), ExecuTorch's quantized kernels
  (``quantized_decomposed::*.out``, loaded from ``executorch.kernels.quantized``, the very
  kernels of the runtime) and ``dim_order_ops::*``; ``executorch_prim::*`` (symbolic-size
  arithmetic, ``et_view``) interpreted here;
- delegate calls through a registry keyed by backend id, empty until something is registered:
  a ``Backend`` object (how many of a call's arguments are inputs, and what computes the
  outputs), or any Python function;
- moves, conditional jumps and frees as the runtime does.

```python
from etkit_pterunner import PteProgram

program = PteProgram.load("model.pte", delegates={"XnnpackBackend": my_python_model})
program.method_names                 # ('forward', ...)
program.delegates                    # backend id, index, size, instructions of each
result = program.run([x], keep_values=True)
result.outputs, result.delegate_calls, result.warnings, result.values
```
"""

from etkit_pterunner.delegates import (
    Backend,
    DelegateCall,
    DelegateFn,
    describe_tensor,
)
from etkit_pterunner.engine import (
    DelegateCallRecord,
    KernelCallRecord,
    RunResult,
    ValueRecord,
)
from etkit_pterunner.errors import (
    ExecutionError,
    ProgramInputError,
    PteError,
    PteFormatError,
    UnsupportedProgramError,
)
from etkit_pterunner.kernels import Frame
from etkit_pterunner.kernels import resolve as resolve_operator
from etkit_pterunner.model import (
    DelegateInfo,
    Instruction,
    ListInfo,
    MethodInfo,
    ScalarInfo,
    TensorInfo,
    ValueInfo,
    dtype_name,
)
from etkit_pterunner.program import PteProgram
from etkit_pterunner.trace import chrome_trace, write_chrome_trace

__version__ = "0.1.0"

__all__: list[str] = [
    "Backend",
    "DelegateCall",
    "DelegateCallRecord",
    "DelegateFn",
    "DelegateInfo",
    "ExecutionError",
    "Frame",
    "Instruction",
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
    "__version__",
    "chrome_trace",
    "describe_tensor",
    "dtype_name",
    "resolve_operator",
    "write_chrome_trace",
]
