"""The code's coupling, measured: import cycles among the store's modules (every import, those under
`if TYPE_CHECKING:` included) and reach-ins: `name._x` where `name` is not `self`/`cls`, outside the
module that owns `_x`.

    python -m dstore.tools.measure.imports [datastore/] [--reach-in datastore training tools]

The store's modules are datastore/ less formats/ and ingest/ (which never import the store):
the top level and store/, order/, memory/, loader/, runtime/, each named by its dotted path under
`dstore` (`store.data_store`, `order.plan`). Prints each cycle (a strongly connected component of
the import graph with more than one module) and each reach-in: an attribute `_x` (not a dunder) read
or written on anything but `self`/`cls` in a module that does not define `_x` itself (a `def _x`,
`class _x`, an assignment to `_x`, `self._x` or `cls._x`, a keyword `_x=`), where some module of the
folders scanned does (the owner). A library's private member (`os._exit`, argparse's `_actions`) has
no owner here: those are counted apart (`library_privates`).
"""

from __future__ import annotations

import argparse
import ast
import pathlib

OUTSIDE = ("formats", "ingest")
"""Subpackages that are not the store's (formats never imports it; ingest writes containers)."""


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
    # compiled extensions are modules too (`from dstore.codec import _jpegcrop` is not the package's
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
            out |= {known(a.name[len(package) + 1 :]) for a in node.names if a.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                out |= {known(a.name) for a in node.names}
            elif node.module.startswith(package + "."):
                sub = node.module[len(package) + 1 :]
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


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_privates(tree: ast.AST) -> set[str]:
    """The private names a module defines: defs, classes, assigned names and attributes, keywords."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            out.add(node.attr)  # an instance's or class's own (a store into another object's is a reach-in)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
    return {n for n in out if _private(n)}


def _reach_ins(*roots: pathlib.Path) -> tuple[list[str], list[str]]:
    """(`file:line: expr` of each reach-in to a member some module here owns, the same of a library's)."""
    trees = {
        p: ast.parse(p.read_text()) for r in roots for p in sorted(r.rglob("*.py")) if "__pycache__" not in p.parts
    }
    own = {p: defined_privates(t) for p, t in trees.items()}
    owned = set().union(*own.values()) if own else set()
    project, library = [], []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own[path]:
                continue  # the owner's own (another instance of its class, its module's names)
            line = f"{path}:{node.lineno}: {ast.unparse(node)}"
            (project if node.attr in owned else library).append(line)
    return project, library


def private_accesses(*roots: pathlib.Path) -> list[str]:
    """`file:line: expr` of each reach-in under `roots`: `name._x` (name not self/cls) outside the
    module that owns `_x`, where a module under `roots` owns it."""
    return _reach_ins(*roots)[0]


def library_privates(*roots: pathlib.Path) -> list[str]:
    """The same for private members no module under `roots` defines (a library's: `os._exit`)."""
    return _reach_ins(*roots)[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Import cycles in datastore/ and private reach-ins in the folders.")
    ap.add_argument("root", nargs="?", default="datastore", help="the package directory (default: datastore)")
    ap.add_argument(
        "--reach-in",
        nargs="+",
        default=["datastore", "training", "tools"],
        metavar="DIR",
        help="the folders whose reach-ins are counted (default: datastore training tools)",
    )
    args = ap.parse_args(argv)
    root = pathlib.Path(args.root)
    graph = graph_of(root)
    found = cycles(graph)
    folders = [pathlib.Path(d) for d in args.reach_in]
    priv, lib = _reach_ins(*folders)
    for c in found:
        print(f"cycle ({len(c)} modules): {' '.join(c)}")
    for line in priv:
        print(f"private: {line}")
    for line in lib:
        print(f"library private: {line}")
    print(
        f"modules: {len(graph)}; cycles: {len(found)}; modules in cycles: {sum(map(len, found))}; "
        f"private reach-ins: {len(priv)}; a library's private members used: {len(lib)}"
    )


if __name__ == "__main__":
    main()
