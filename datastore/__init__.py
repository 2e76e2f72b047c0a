"""dstore: a distributed in-memory data store served over MPI one-sided communication.

The one import root of the project. The repository's folders map onto it: datastore/ is `dstore`
(the store, formats, ingest), training/ is `dstore.training` (the trainer), tools/ is `dstore.tools`
(the `dstore` command line, the bench and the measurement scripts); docs/design.md has the module map.

`from dstore import DataStore, MixedStore, StoreLoader` is the public API. Both are imported on first use
(module `__getattr__`), so `import dstore` imports neither mpi4py (whose import initialises MPI: the
FUSE process of `dstore pfs` must not) nor torch.
"""

import importlib
from typing import TYPE_CHECKING

from dstore.errors import (
    ChecksumError,
    ConfigError,
    ContainerChangedError,
    DStoreError,
    FormatError,
    IncompleteContainerError,
    MemoryBudgetError,
    SampleError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports them on first use
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore
    from dstore.store.mixed import MixedStore

_LAZY = {"DataStore": "dstore.store.data_store", "MixedStore": "dstore.store.mixed", "StoreLoader": "dstore.loader.store_loader"}

__all__ = [
    "ChecksumError",
    "ConfigError",
    "ContainerChangedError",
    "DStoreError",
    "DataStore",
    "FormatError",
    "IncompleteContainerError",
    "MemoryBudgetError",
    "MixedStore",
    "SampleError",
    "StoreLoader",
    "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
