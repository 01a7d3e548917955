"""etkit-partition: partition tag policies and a policy partitioner wrapper for ExecuTorch
partitioners."""

from etkit_partition.dtypes import DetagQuantizeDtypes
from etkit_partition.dynamic import DetagDynamicReshapes
from etkit_partition.float_results import DetagQuantizeOfFloatResults
from etkit_partition.moves import DetagMovedQuantizes, integer_moves
from etkit_partition.normalization import instance_norms_as_moments
from etkit_partition.pads import DetagQuantizedPads
from etkit_partition.partitioner import PolicyPartitioner
from etkit_partition.policies import (
    DetagInputQuantize,
    DetagOps,
    DetagOutputDequantize,
    PartitionPolicy,
    duplicate_dequantize,
    merge_partitions,
    repair_partitions,
    user_input_nodes,
    user_output_nodes,
)
from etkit_partition.reductions import DetagMaximaOverChannels

__version__ = "0.1.0"

__all__: list[str] = [
    "DetagDynamicReshapes",
    "DetagInputQuantize",
    "DetagMaximaOverChannels",
    "DetagMovedQuantizes",
    "DetagOps",
    "DetagOutputDequantize",
    "DetagQuantizeDtypes",
    "DetagQuantizeOfFloatResults",
    "DetagQuantizedPads",
    "PartitionPolicy",
    "PolicyPartitioner",
    "__version__",
    "duplicate_dequantize",
    "instance_norms_as_moments",
    "integer_moves",
    "merge_partitions",
    "repair_partitions",
    "user_input_nodes",
    "user_output_nodes",
]
