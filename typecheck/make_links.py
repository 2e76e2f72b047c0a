"""Rebuild typecheck/dstore: the repository's three folders under their one import name, for pyright.

pyright names a file by the folder it sits in, so datastore/store/epoch.py would be checked as
`datastore.store.epoch` while every module imports it as `dstore.store.epoch`: two names, two classes to the
checker. typecheck/dstore is a committed tree of relative links that lays the folders out as
[tool.setuptools] package-dir installs them (datastore/ is `dstore`, training/ is
`dstore.training`, tools/ is `dstore.tools`); [tool.pyright] checks it and resolves `dstore`
there (include, extraPaths). pyright always leaves out the editable install's own link tree
(build/__editable__.*), so that one cannot serve.

Run after adding or removing a top-level entry of datastore/ (tests/test_package.py fails until
then): ``python typecheck/make_links.py``. The subpackages (store/, order/, memory/, loader/,
runtime/, formats/, ingest/) and training/, tools/ are linked whole, so files added inside them
need nothing.
"""

from __future__ import annotations

import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.join(REPO, "typecheck", "dstore")
SKIP = {"__pycache__"}


def expected(repo: str = REPO) -> dict[str, str]:
    """The links the tree must hold: name in typecheck/dstore -> relative target."""
    links = {
        name: os.path.join("..", "..", "datastore", name)
        for name in sorted(os.listdir(os.path.join(repo, "datastore")))
        if name not in SKIP and not name.endswith((".pyc", ".so"))
    }  # .so: a build output (.gitignore)
    for sub in ("training", "tools"):  # dstore.training, dstore.tools (package-dir)
        if sub in links:
            raise SystemExit(f"datastore/{sub} would hide the {sub}/ folder as dstore.{sub}: rename it")
        links[sub] = os.path.join("..", "..", sub)
    return links


def actual(tree: str = TREE) -> dict[str, str]:
    """The links the tree holds now (a plain file or folder reads as '<not a link>')."""
    if not os.path.isdir(tree):
        return {}
    return {
        name: os.readlink(os.path.join(tree, name)) if os.path.islink(os.path.join(tree, name)) else "<not a link>"
        for name in sorted(os.listdir(tree))
    }


def main() -> int:
    if os.path.isdir(TREE) and not os.path.islink(TREE):
        shutil.rmtree(TREE)  # links only: rmtree does not follow them
    os.makedirs(TREE)
    for name, target in expected().items():
        os.symlink(target, os.path.join(TREE, name))
    print(f"typecheck/dstore: {len(expected())} links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
