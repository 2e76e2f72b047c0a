"""The code as values (NOTE [ The store as values ] in dstore.store.storeplan; the loader's plan and
pipeline, dstore.loader.pipeline): no import cycle among the store's modules (datastore/ less formats/
and ingest/, typing imports included), no module reaching into another object's private members by
any name (dstore.tools.measure.imports counts both), and no shuffle policy's name compared outside
dstore.order.policy."""

import pathlib

from dstore.tools.measure import imports

ROOT = pathlib.Path(__file__).resolve().parent.parent / "datastore"


def test_no_import_cycle_among_the_store_modules():
    graph = imports.graph_of(ROOT)
    assert {"store.data_store", "order.plan", "loader.store_loader", "runtime.job", "verify"} <= set(graph)
    assert "order.plan" in graph["store.data_store"]  # subpackage imports resolve to their modules
    assert imports.cycles(graph) == []


def test_the_measure_sees_a_cycle_across_subpackages(tmp_path):
    (tmp_path / "order").mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "order" / "plan.py").write_text("from dstore.store import epoch\n")
    (tmp_path / "store" / "epoch.py").write_text("from dstore.order.plan import block_bounds\n")
    (tmp_path / "ingest").mkdir()  # not the store's: left out
    (tmp_path / "ingest" / "run.py").write_text("from dstore.store.epoch import Batch\n")
    assert imports.cycles(imports.graph_of(tmp_path)) == [["order.plan", "store.epoch"]]


def test_the_measure_finds_a_cycle_and_a_private_access(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dstore.b import B\n")
    (tmp_path / "b.py").write_text("from dstore import a\n\ndef f(store):\n    store._advance(1)\n")
    (tmp_path / "c.py").write_text("class C:\n    def _advance(self, n):\n        self._n = n\n")
    graph = {p.stem: imports.imports_of(p) for p in (tmp_path / "a.py", tmp_path / "b.py")}
    assert imports.cycles(graph) == [["a", "b"]]
    assert len(imports.private_accesses(tmp_path)) == 1


def test_no_module_reaches_into_another_objects_private_members(tmp_path):
    # `name._x` by any name (not self/cls) outside the module that owns `_x`: the loader's epoch once
    # read nine of StoreLoader's private members and wrote its position back (issue 37).
    repo = ROOT.parent
    assert imports.private_accesses(*(repo / d for d in ("datastore", "training", "tools"))) == []
    (tmp_path / "store").mkdir()
    (tmp_path / "loader").mkdir()
    (tmp_path / "store" / "data_store.py").write_text(
        "class DataStore:\n    def _advance(self, n):\n        self._pos = n\n\n"
        "def other(store):\n    store._advance(1)\n"
    )  # the owner's own, on another instance
    (tmp_path / "loader" / "epoch.py").write_text(
        "def run(ld, st):\n    ld._pos = st._advance(1)\n    return self_._pos, os._exit\n"
    )
    found = imports.private_accesses(tmp_path)
    assert sorted(line.split(": ", 1)[1] for line in found) == ["ld._pos", "self_._pos", "st._advance"], found
    assert [line.split(": ", 1)[1] for line in imports.library_privates(tmp_path)] == ["os._exit"]


def _policy_name_comparisons(root: pathlib.Path) -> list[str]:
    """Each comparison (`==`, `!=`, `in`, `not in`, `is`) of a shuffle policy's name in the sources
    under `root`, outside the policies' table: `"global"`/`"partial"` anywhere, `"local"` where the
    other side names a shuffle or policy (`"local"` is also a storage spec)."""
    import ast

    from dstore.order.policy import NAMES

    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "policy.py" and path.parent.name == "order":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            names = {
                c.value
                for o in operands
                for c in ast.walk(o)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in NAMES
            }
            others = " ".join(ast.unparse(o) for o in operands).lower()
            if names - {"local"} or (names and ("shuffle" in others or "policy" in others)):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_shuffle_policy_name_is_compared_outside_its_table(tmp_path):
    # dstore.order.policy holds one object per policy; a module that compares a policy's name takes a
    # branch a new policy would fall into silently (docs/design.md, "The epoch order").
    repo = ROOT.parent
    assert [f for folder in ("datastore", "training", "tools") for f in _policy_name_comparisons(repo / folder)] == []
    (tmp_path / "a.py").write_text(
        'if cfg.shuffle != "global":\n    pass\nif spec == "local":\n    pass\n'
        'ok = policy(name) in ("local", "partial")\n'
    )
    assert [line.split(": ", 1)[1] for line in _policy_name_comparisons(tmp_path)] == [
        "cfg.shuffle != 'global'",
        "policy(name) in ('local', 'partial')",
    ]


LAYERS = ["errors", "runtime", "formats", "order", "memory", "codec", "ingest", "store", "loader", "verify", "__init__"]
"""datastore/'s folders (and top-level modules) from the bottom up (docs/design.md, "Layers"): a module
imports only from its own layer or those below it."""
UPWARD_KNOWN: dict[tuple[str, str], str] = {}
"""The upward imports there are, each with why; the test fails on any other (and on one of these gone,
so that this table shrinks with the code)."""


def _layer_edges(root: pathlib.Path) -> set[tuple[str, str]]:
    """(importer's layer, imported's layer) for every import between two layers of `root` (typing
    imports and imports inside functions included)."""
    mods = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts) or "__init__"] = p
    known = set(mods) | {".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.pyi")}
    out = set()
    for name, path in mods.items():
        for dep in imports.imports_of(path, "dstore", known):
            a, b = name.split(".")[0], dep.split(".")[0]
            if a != b:
                out.add((a, b))
    return out


def test_layers_import_only_downward():
    edges = _layer_edges(ROOT)
    unplaced = {a for e in edges for a in e} - set(LAYERS)
    assert not unplaced, f"a folder with no layer: {sorted(unplaced)}"
    upward = {(a, b) for a, b in edges if LAYERS.index(a) < LAYERS.index(b)}
    new, gone = upward - set(UPWARD_KNOWN), set(UPWARD_KNOWN) - upward
    assert not new and not gone, (
        f"upward imports: {sorted(new)}; known ones gone (drop them from UPWARD_KNOWN): {sorted(gone)}"
    )


def test_no_import_cycle_among_all_of_datastores_modules():
    # formats/ and ingest/ too (the store's test leaves them out): formats.base and formats.fields
    # imported each other inside functions and under TYPE_CHECKING until issue 37.
    mods = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts) or "__init__"] = p
    known = set(mods) | {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.rglob("*.pyi")}
    graph = {n: {m for m in imports.imports_of(p, "dstore", known) if m != n} for n, p in mods.items()}
    assert "formats.fields" in graph["formats.base"]
    assert imports.cycles(graph) == []
