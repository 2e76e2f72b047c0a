"""Move datastore/'s flat modules into their subpackages and rewrite every reference to them.

The table MOVED is the rename (old module under `dstore` -> new dotted path under `dstore`). The script
is idempotent: run it again after merging a branch written against the old layout and it rewrites
that branch's new references too, leaving the rewritten ones alone.

    python typecheck/rename_modules.py           # rewrite references in the tracked files
    python typecheck/rename_modules.py --move    # first `git mv` files still at their old paths

What it rewrites, in every tracked .py, .md, .toml, .sh, .c and .ci/run (CHANGELOG.md and
docs/history.md are history and keep the old names):
- `from dstore import a, b as c` lines: a moved module is imported from its new package, under its
  old name where its file name changed (`from dstore.memory import limits as memory`), so the code
  below the import reads unchanged;
- dotted names: `dstore.old` (imports, `import dstore.old`, `-m dstore.old`, strings given to mock
  or monkeypatch, prose) -> `dstore.new`. `dstore.store` and `dstore.memory` name packages now: they
  are rewritten only where an attribute of the old module follows (`dstore.store.DataStore`,
  `from dstore.memory import parse_bytes`); the bare name is left alone and listed for a look;
- paths: `datastore/old.py` -> `datastore/new/path.py` (docs, comments, the module map).
Then `ruff check --fix --select I` puts the rewritten imports back in order. A line with the marker
`rename_modules: keep` (KEEP) is left alone.

After merging branches written against the old layout (rebase this branch commit by commit onto
them, never squashed, so the move commit's renames carry their edits to the new paths): where that
commit conflicts in a file it changed only by this script's rewrites, take the other side of the
file (`git checkout --ours FILE` during a rebase), run this script, `git add` it and continue. Its
other edits are by hand and must be kept: pyproject.toml (the package list, the extension's path),
.gitignore (datastore/**/*.so), datastore/__init__.py (`_LAZY`: dstore.store.data_store) and
tests/test_package.py (the expected module names). Once rebased, run it again for references the
merged branches added elsewhere (their new modules; docs/reliability.md, left to the lead), then
`python typecheck/make_links.py` if they added a top-level module, and `pip install -e` again. A new
top-level module of theirs that belongs in a folder: add it to MOVED and run with --move.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MOVED = {
    # the store engine (MPI): DataStore and what it is built from
    "store": "store.data_store",
    "mixed": "store.mixed",
    "config": "store.config",
    "storeplan": "store.storeplan",
    "epoch": "store.epoch",
    "populate": "store.populate",
    "preload": "store.preload",
    "prefault": "store.prefault",
    "stream": "store.stream",
    "storage": "store.storage",
    "index": "store.index",
    "window": "store.window",
    "fieldstore": "store.fieldstore",
    # pure arithmetic: which sample, where, when (no MPI, no I/O)
    "plan": "order.plan",
    "shuffle": "order.shuffle",
    "permute": "order.permute",
    "mix": "order.mix",
    "tiers": "order.tiers",
    # how much fits: a rank's budget, the node's limits, `dstore plan`'s forecast, the page cache
    "budget": "memory.budget",
    "memory": "memory.limits",
    "capacity": "memory.capacity",
    "pagecache": "memory.pagecache",
    # the loader: bytes -> tensors
    "torch": "loader.store_loader",
    "torch_epoch": "loader.epoch",
    "workers": "loader.workers",
    "decode_worker": "loader.decode_worker",
    "decode": "codec.decode",
    "kernels": "codec.kernels",
    "resize": "codec.resize",
    "draws": "loader.draws",
    "_jpegcrop": "codec._jpegcrop",
    # the job around every layer
    "job": "runtime.job",
    "collective": "runtime.collective",
    "preemption": "runtime.preemption",
    "heartbeat": "runtime.heartbeat",
    "progress": "runtime.progress",
    "rc": "runtime.rc",
    "units": "runtime.units",
    "integrity": "runtime.integrity",
}
PACKAGES = sorted({new.split(".")[0] for new in MOVED.values()})
# each package's modules: those moved into it and those added since (`memory.costs`), never an old module's attribute
SUBMODULES = {
    pkg: {new.split(".")[1] for new in MOVED.values() if new.startswith(pkg + ".")}
    | {os.path.splitext(f)[0] for f in os.listdir(os.path.join(REPO, "datastore", pkg)) if f.endswith(".py")}
    for pkg in PACKAGES
}
SKIP = {"CHANGELOG.md", "docs/history.md", "typecheck/rename_modules.py"}
SUFFIXES = (".py", ".md", ".toml", ".sh", ".c", ".cfg", ".yaml", ".yml", ".txt")

_DOTTED = re.compile(r"(?<![\w.])dstore\.(\w+)(?=(\.\w+)?)(?=(\s+import\s+(\w+))?)")
_FROM = re.compile(r"^(?P<indent>[ \t]*)from dstore import (?P<names>[\w ,]+?)(?P<tail>[ \t]*(#.*)?)$", re.MULTILINE)
_FROM_INLINE = re.compile(
    r"(?:(?<=[\"'; ])|(?<=\\n))from dstore import (?P<names>[\w ,]+?)(?=\\n|[\"';])"
)  # code in strings
_PATH = re.compile(r"(?<![\w/])(?P<pre>(?:\.\./)*)datastore/(?P<name>\w+)\.(?P<ext>py|c)\b")


def _dotted(m: re.Match) -> str:
    old, nxt = m.group(1), (m.group(2) or "")[1:]
    if old not in MOVED:
        return m.group(0)
    if old in SUBMODULES:  # `store`, `memory`: a module then, a package now
        after = nxt or m.group(4)
        if not after or after in SUBMODULES[old]:
            return m.group(0)  # the package (`dstore.store`), or already new (`from dstore.store import epoch`)
    return "dstore." + MOVED[old]


def _from_line(m: re.Match) -> str:
    inline = "indent" not in m.re.groupindex  # `"...\\nfrom dstore import x\\n..."`: one line, `; ` between
    indent, tail = ("", "") if inline else (m.group("indent"), m.group("tail"))
    kept: list[str] = []
    by_pkg: dict[str, list[str]] = {}
    for item in (s.strip() for s in m.group("names").split(",")):
        if not item:
            continue
        name, _, alias = (p.strip() for p in item.partition(" as "))
        if name not in MOVED:
            kept.append(item)
            continue
        pkg, new = MOVED[name].rsplit(".", 1)
        alias = alias or (name if new != name else "")
        by_pkg.setdefault(pkg, []).append(f"{new} as {alias}" if alias else new)
    if not by_pkg:
        return m.group(0)
    lines = [f"from dstore import {', '.join(kept)}"] if kept else []
    lines += [f"from dstore.{pkg} import {', '.join(names)}" for pkg, names in sorted(by_pkg.items())]
    lines[0] += tail
    return ("; " if inline else "\n").join(indent + line for line in lines)


def _path(m: re.Match) -> str:
    name = m.group("name")
    if name not in MOVED:
        return m.group(0)
    return f"{m.group('pre')}datastore/{MOVED[name].replace('.', '/')}.{m.group('ext')}"


KEEP = "rename_modules: keep"
"""A line holding this (in a comment) names an old path on purpose (the aliases that keep old
import paths working, their test) and is left as it is."""


def rewrite(text: str) -> str:
    """`text` with every reference to a moved module under its new name (idempotent)."""
    return "".join(line if KEEP in line else _rewrite(line) for line in text.splitlines(keepends=True))


def _rewrite(text: str) -> str:
    text = _FROM.sub(_from_line, text)
    text = _FROM_INLINE.sub(_from_line, text)
    text = _DOTTED.sub(_dotted, text)
    return _PATH.sub(_path, text)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    return [
        f
        for f in out.splitlines()
        if f not in SKIP
        and (f.endswith(SUFFIXES) or f == ".ci/run")
        and not f.startswith("typecheck/dstore/")
        and os.path.isfile(os.path.join(REPO, f))
        and not os.path.islink(os.path.join(REPO, f))
    ]


def move() -> None:
    """`git mv` each module still at its old path; a new package gets an __init__.py (a docstring)."""
    for pkg in PACKAGES:
        init = os.path.join(REPO, "datastore", pkg, "__init__.py")
        if not os.path.exists(init):
            os.makedirs(os.path.dirname(init), exist_ok=True)
            with open(init, "w") as f:
                f.write(f'"""dstore.{pkg}: see docs/design.md, "Layers"."""\n')
            subprocess.run(["git", "add", init], cwd=REPO, check=True)
    for old, new in MOVED.items():
        for ext in (".py", ".c"):
            src = os.path.join("datastore", old + ext)
            if os.path.isfile(os.path.join(REPO, src)):
                dst = os.path.join("datastore", *new.split(".")) + ext
                subprocess.run(["git", "mv", src, dst], cwd=REPO, check=True)
                print(f"moved {src} -> {dst}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--move", action="store_true", help="git mv the modules still at their old paths first")
    args = ap.parse_args(argv)
    if args.move:
        move()
    changed = []
    for rel in tracked_files():
        path = os.path.join(REPO, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = rewrite(text)
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(rel)
    bare = [
        f"{rel}:{n}"
        for rel in tracked_files()
        if rel.endswith(".py")
        for n, line in enumerate(open(os.path.join(REPO, rel)), 1)
        if re.search(r"(?<![\w.])dstore\.(" + "|".join(SUBMODULES) + r")\b(?!\.\w|\s+import)", line)
    ]
    stale = [
        rel
        for rel in tracked_files()
        if rel.endswith(".py")
        and re.search(
            r"^\s*from \.(" + "|".join(MOVED) + r") import", open(os.path.join(REPO, rel)).read(), re.MULTILINE
        )
    ]
    py = [c for c in changed if c.endswith(".py")]
    if py:
        subprocess.run([sys.executable, "-m", "ruff", "check", "--fix", "--select", "I", "-q", *py], cwd=REPO)
    print(f"rewrote {len(changed)} files")
    for where in bare:
        print(f"bare dstore.store or dstore.memory (the package now; the old module?): {where}")
    for rel in stale:
        print(f"relative import of a moved module (rewrite by hand): {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
