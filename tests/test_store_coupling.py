"""The store's modules as values (NOTE [ The store as values ] in dstore.store.storeplan): no import cycle
among datastore/ modules (typing imports included) and no module but store.py touching a store's
private members (dstore.tools.measure.imports counts both)."""

import pathlib

from dstore.tools.measure import imports

ROOT = pathlib.Path(__file__).resolve().parent.parent / "datastore"


def test_no_import_cycle_among_the_store_modules():
    graph = {p.stem: imports.imports_of(p) for p in ROOT.glob("*.py")}
    assert imports.cycles(graph) == []


def test_the_measure_finds_a_cycle_and_a_private_access(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dstore.b import B\n")
    (tmp_path / "b.py").write_text("from dstore import a\n\ndef f(store):\n    store._advance(1)\n")
    graph = {p.stem: imports.imports_of(p) for p in tmp_path.glob("*.py")}
    assert imports.cycles(graph) == [["a", "b"]]
    assert len(imports.private_accesses(tmp_path)) == 1


def test_no_module_but_the_store_touches_its_private_members():
    assert imports.private_accesses(ROOT) == []
