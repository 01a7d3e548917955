"""etkit-partition: partition tag policies and a policy partitioner wrapper for
ExecuTorch partitioners."""

__version__ = "0.1.0"

__all__ = ["__version__"]
