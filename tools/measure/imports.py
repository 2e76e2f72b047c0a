"""The store's coupling, measured: import cycles among datastore/ modules (every import, those under
`if TYPE_CHECKING:` included) and the accesses of a store's private members from other modules.

    python -m dstore.tools.measure.imports [datastore/]

Prints each cycle (a strongly connected component of the import graph with more than one module)
and each `store._x` / `self._store._x` / `<DataStore>._x` access outside datastore/store/data_store.py.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re

PRIVATE = re.compile(r"\b(?:store|self\._store|stores?\[[^]]*\])\._[a-z]\w*")


def imports_of(path: pathlib.Path, package: str = "dstore") -> set[str]:
    """The `package` modules `path` imports (top-level, in functions and under TYPE_CHECKING alike)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                out |= {a.name for a in node.names}
            elif node.module.startswith(package + "."):
                out.add(node.module.split(".")[1])
    return out


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
    """`file:line: text` of each access to a store's private member outside store.py."""
    out = []
    for path in sorted(root.glob("*.py")):
        if path.name == "store.py":
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
    graph = {p.stem: imports_of(p) for p in root.glob("*.py")}
    found = cycles(graph)
    priv = private_accesses(root)
    for c in found:
        print(f"cycle ({len(c)} modules): {' '.join(c)}")
    for line in priv:
        print(f"private: {line}")
    print(f"cycles: {len(found)}; modules in cycles: {sum(map(len, found))}; private accesses: {len(priv)}")


if __name__ == "__main__":
    main()
