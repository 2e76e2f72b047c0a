"""dstore: a distributed in-memory data store served over MPI one-sided communication.

The one import root of the project. The repository's folders map onto it: datastore/ is `dstore`
(the store, formats, ingest), training/ is `dstore.training` (the trainer), tools/ is `dstore.tools`
(the `dstore` command line, the bench and the measurement scripts); docs/design.md has the module map.
Inside `dstore`: store/ (the engine), order/ (pure arithmetic), memory/, loader/, runtime/,
formats/, ingest/.

`from dstore import DataStore, MixedStore, StoreLoader` is the public API. Both are imported on first use
(module `__getattr__`), so `import dstore` imports neither mpi4py (whose import initialises MPI: the
FUSE process of `dstore pfs` must not) nor torch.
"""

import importlib
import importlib.abc
import importlib.util
import sys
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

_LAZY = {
    "DataStore": "dstore.store.data_store",
    "MixedStore": "dstore.store.mixed",
    "StoreLoader": "dstore.loader.store_loader",
}

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


def lazy_getattr(package: str, table: dict[str, str], namespace: dict):
    """A package's module `__getattr__` that imports each name of `table` (name -> module) from its
    module on first use and keeps it in `namespace` (the package's globals()): the packages of
    dstore name their public classes without importing torch or MPI until asked."""

    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


MOVED = {  # rename_modules: keep (the old names, on purpose)
    "dstore.torch": "dstore.loader.store_loader",  # rename_modules: keep
    "dstore.preemption": "dstore.runtime.preemption",  # rename_modules: keep
    "dstore.pagecache": "dstore.memory.pagecache",  # rename_modules: keep
}
"""Import paths the docs of release 0.1.0 showed users before the modules moved into subpackages
(issue 30), each the same module object as its new path; paths no release showed are not kept.
(`dstore.store` is a package now that serves `DataStore` itself.) The project's own code uses the
new paths (tests/test_package.py)."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An old name in MOVED imports as the module at its new name itself (not a copy: one class,
    one set of module globals), loaded only when the old name is imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])  # kept as is: its __name__ and __spec__ are the new

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):  # once, even if dstore is reloaded
    sys.meta_path.append(_MovedFinder())
