"""The store's coupling, measured: import cycles among the store's modules (every import, those under
`if TYPE_CHECKING:` included) and the accesses of a store's private members from other modules.

    python -m dstore.tools.measure.imports [datastore/]

The store's modules are datastore/ less formats/ and ingest/ (which never import the store):
the top level and store/, order/, memory/, loader/, runtime/, each named by its dotted path under
`dstore` (`store.data_store`, `order.plan`). Prints each cycle (a strongly connected component of
the import graph with more than one module) and each `store._x` / `self._store._x` /
`<DataStore>._x` access outside datastore/store/data_store.py.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re

PRIVATE = re.compile(r"\b(?:store|self\._store|stores?\[[^]]*\])\._[a-z]\w*")
OUTSIDE = ("formats", "ingest")
"""Subpackages that are not the store's (formats never imports it; ingest writes containers)."""
OWNER = "store/data_store.py"
"""The one module that may touch a store's private members: DataStore's own."""


def store_modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """The store's modules under `root` by dotted name (`store.data_store`; a package's __init__.py
    by the package's name), OUTSIDE left out."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        if rel.parts[0] in OUTSIDE or "__pycache__" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts) or "__init__"] = path
    return out


def graph_of(root: pathlib.Path, package: str = "dstore") -> dict[str, set[str]]:
    """Module -> the store's modules it imports, for the store's modules under `root`."""
    modules = store_modules(root)
    # compiled extensions are modules too (`from dstore.loader import _jpegcrop` is not the package's
    # __init__); their stubs name them, and as leaves outside the graph they close no cycle
    known = set(modules) | {".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.pyi")}
    return {name: {m for m in imports_of(path, package, known) if m != name} for name, path in modules.items()}


def imports_of(path: pathlib.Path, package: str = "dstore", modules: set[str] | None = None) -> set[str]:
    """The `package` modules `path` imports (top-level, in functions and under TYPE_CHECKING alike),
    by their names under `package`. With `modules` (the names there are), `from dstore.order import
    plan` is `order.plan` and `from dstore.store.epoch import Batch` is `store.epoch`; without, each
    name is what follows `package.` up to its first dot (a flat package)."""

    def known(name: str) -> str:
        if modules is None:
            return name.split(".")[0]
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {known(a.name[len(package) + 1:]) for a in node.names if a.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                out |= {known(a.name) for a in node.names}
            elif node.module.startswith(package + "."):
                sub = node.module[len(package) + 1:]
                out |= {known(f"{sub}.{a.name}") for a in node.names}
    return out - {""}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def private_accesses(root: pathlib.Path) -> list[str]:
    """`file:line: text` of each access to a store's private member outside OWNER."""
    out = []
    for path in store_modules(root).values():
        if path.relative_to(root).as_posix() == OWNER:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE.search(line):
                out.append(f"{path}:{n}: {line.strip()}")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Import cycles and private store accesses in datastore/.")
    ap.add_argument("root", nargs="?", default="datastore", help="the package directory (default: datastore)")
    args = ap.parse_args(argv)
    root = pathlib.Path(args.root)
    graph = graph_of(root)
    found = cycles(graph)
    priv = private_accesses(root)
    for c in found:
        print(f"cycle ({len(c)} modules): {' '.join(c)}")
    for line in priv:
        print(f"private: {line}")
    print(f"modules: {len(graph)}; cycles: {len(found)}; modules in cycles: {sum(map(len, found))}; "
          f"private accesses: {len(priv)}")


if __name__ == "__main__":
    main()
