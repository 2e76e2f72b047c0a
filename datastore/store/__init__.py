"""The store engine (MPI): `DataStore` and the modules it is built from.

`data_store.py` is `DataStore` (the one object that holds a store's state); `storeplan.py` what a
store is, as a frozen value; `config.py` its arguments; `populate.py`, `preload.py`, `prefault.py`,
`stream.py` fill its windows (`window.py`, the only module that touches `MPI.Win`) and its node
index (`index.py`); `epoch.py` serves one epoch; `storage.py` reads what is not resident;
`mixed.py` is `MixedStore`, several stores served as one. docs/design.md, "The store engine".

The guide's import path before the move, `from dstore.store.data_store import DataStore`, still works
(rename_modules: keep): the names below are loaded on first use, so importing a submodule loads no MPI.
"""

from typing import TYPE_CHECKING

from dstore import lazy_getattr

if TYPE_CHECKING:
    from dstore.store.data_store import DataStore
    from dstore.store.epoch import Batch
    from dstore.store.mixed import MixedStore

_LAZY = {"DataStore": "dstore.store.data_store", "Batch": "dstore.store.epoch", "MixedStore": "dstore.store.mixed"}

__all__ = ["Batch", "DataStore", "MixedStore"]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
