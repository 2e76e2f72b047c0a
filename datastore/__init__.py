"""dstore: a distributed in-memory data store served over MPI one-sided communication."""

from datastore.errors import (
    ChecksumError,
    ConfigError,
    DStoreError,
    FormatError,
    IncompleteContainerError,
    MemoryBudgetError,
    SampleError,
)

__version__ = "0.1.0"

__all__ = [
    "ChecksumError",
    "ConfigError",
    "DStoreError",
    "FormatError",
    "IncompleteContainerError",
    "MemoryBudgetError",
    "SampleError",
    "__version__",
]
