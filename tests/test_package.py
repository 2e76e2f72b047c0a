"""The package: one import root `dstore` over the repository's three folders (datastore/ -> dstore,
training/ -> dstore.training, tools/ -> dstore.tools), in the wheel and in the source."""

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"datastore": "dstore", "training": "dstore/training", "tools": "dstore/tools"}
OLD_ROOTS = {"datastore", "training", "tools"}


def _source_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    """The wheel built from a clean copy of the sources (no stale build/ of an earlier layout)."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (whl,) = out.glob("*.whl")
    assert whl.name.startswith("dstore_mpi-"), whl.name
    with zipfile.ZipFile(whl) as zf:
        yield zf


def test_wheel_installs_only_dstore(wheel):
    top = {name.split("/")[0] for name in wheel.namelist()}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1 and top - dist_info == {"dstore"}, sorted(top)
    entry_points = wheel.read(f"{dist_info.pop()}/entry_points.txt").decode()
    assert "dstore = dstore.tools.cli:main" in entry_points


def test_wheel_holds_every_module(wheel):
    # The package list in pyproject.toml is explicit: a new sub-package must be added there.
    names = set(wheel.namelist())
    missing = [
        str(p.relative_to(REPO))
        for p in _source_files(*FOLDERS)
        if f"{FOLDERS[p.relative_to(REPO).parts[0]]}/{'/'.join(p.relative_to(REPO).parts[1:])}" not in names
    ]
    assert not missing, f"in the repository but not in the wheel (add them to [tool.setuptools] packages): {missing}"


def test_import_root_is_light_and_installed(tmp_path):
    # From a directory outside the repository (only the install can provide `dstore`), as a process
    # started by mpiexec would: the root imports neither torch nor mpi4py (whose import initialises
    # MPI), nor do the command line (`dstore --help` stays fast) and the FUSE server of `dstore pfs`
    # (started from MPI ranks, it must not be taken for one); the public API is there on first use.
    code = (
        "import sys, dstore, dstore.tools.cli, dstore.tools.pfs.fs\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mpi4py'))\n"
        "assert not heavy, heavy\n"
        "from dstore import DataStore, StoreLoader\n"
        "import dstore.training.run, dstore.tools.cli\n"
        # what a training run on a container never uses stays unloaded: the ingest package (27 modules),
        # object storage, zarr (issue 37 item 6: the run's import is torch's, plus ~0.2 CPU-s of its own)
        "unused = sorted(m for m in sys.modules if m.startswith(('dstore.ingest', 'fsspec', 's3fs', 'zarr')))\n"
        "assert not unused, unused\n"
        "print(DataStore.__module__, StoreLoader.__module__, dstore.tools.cli.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["dstore.store.data_store", "dstore.loader.store_loader", "dstore.tools.cli"]


def test_no_import_of_the_old_roots():
    # datastore/training/tools are folders, not import names: an `import training` would pick up
    # whatever `training` the current directory or site-packages holds.
    bad = []
    for path in _source_files(*FOLDERS, "tests"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # code in strings, run by subprocesses
                mods = [
                    line.split()[1]
                    for line in node.value.splitlines()
                    if line.strip().startswith(("from ", "import ")) and len(line.split()) > 1
                ]
            elif isinstance(node, ast.List):
                # [sys.executable, "-m", MODULE, ...]
                items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                mods = [str(m) for flag, m in zip(items, items[1:]) if flag == "-m"]
            else:
                continue
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {m}" for m in mods if m.split(".")[0] in OLD_ROOTS]
    assert not bad, bad


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = [*FOLDERS[rel.parts[0]].split("/"), *rel.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_module_imports_form_no_cycle():
    # Imports at module level (where they belong) must form a DAG; a cycle hidden by an import
    # inside a function counts too, since it is a cycle all the same. Imports under
    # `if TYPE_CHECKING:` never run (a helper naming its owner's type, e.g. `store: DataStore`).
    modules = {_module_name(p): p for p in _source_files(*FOLDERS)}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package's own parents are loaded first
                    deps.add(t)
        edges[name] = deps
    state: dict[str, int] = {}
    cycles = []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for d in sorted(edges[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_wheel_carries_the_license_and_the_one_version(wheel):
    import dstore

    names = wheel.namelist()
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = wheel.read(meta).decode()
    assert f"\nVersion: {dstore.__version__}\n" in text  # read from dstore.__version__, written nowhere else
    assert any(n.endswith("licenses/LICENSE") for n in names), names
    assert "Apache License" in wheel.read(next(n for n in names if n.endswith("licenses/LICENSE"))).decode()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert dstore.__version__ not in pyproject.split("[tool.setuptools.dynamic]")[0]


def test_wheel_is_typed(wheel):
    # PEP 561: users' type checkers read dstore's annotations only where the package says it has them.
    assert "dstore/py.typed" in wheel.namelist()


def test_the_editable_install_maps_the_folders():
    # The README's install (pip install -e .) maps datastore/, training/ and tools/ onto dstore by
    # setuptools' editable finder: a module added to any of them imports at once, with no reinstall
    # (an older install as a tree of links, editable_mode=strict, needed one per new module).
    import importlib.util

    spec = importlib.util.find_spec("dstore")
    assert spec is not None and spec.origin is not None
    origin = Path(spec.origin)
    if REPO not in origin.resolve().parents:
        pytest.skip("dstore is installed from elsewhere (not an editable install of this checkout)")
    if origin.resolve() != origin:
        pytest.skip(
            "dstore is installed as a tree of links (editable_mode=strict): a new module needs "
            "pip install -e again; the README's install is pip install -e ."
        )
    for name, folder in (("dstore", "datastore"), ("dstore.training", "training"), ("dstore.tools", "tools")):
        found = importlib.util.find_spec(name)
        assert found is not None and found.submodule_search_locations is not None, name
        assert [Path(p).resolve() for p in found.submodule_search_locations] == [REPO / folder], name


def test_the_design_module_map_lists_every_module():
    # docs/design.md's module map is a table row per module; a module added or removed without its
    # row makes the map lie to the next reader, so the map is checked against the files.
    import re

    text = (REPO / "docs" / "design.md").read_text()
    start = text.index("\n## Module map")
    section = text[start : text.index("\n## ", start + 1)]
    rows = re.findall(r"^\| `([\w/]+\.py)` \|", section, re.MULTILINE)
    listed = set(rows)
    files = {str(p.relative_to(REPO)) for p in _source_files(*FOLDERS)}
    assert len(rows) == len(listed), f"listed twice: {sorted(r for r in listed if rows.count(r) > 1)}"
    assert not files - listed, f"modules missing from docs/design.md's module map: {sorted(files - listed)}"
    assert not listed - files, f"docs/design.md's module map names modules that do not exist: {sorted(listed - files)}"


def test_the_type_check_tree_holds_every_module_under_its_import_name():
    # pyright checks typecheck/dstore ([tool.pyright]): a module the tree does not reach is not type
    # checked at all, and a link to a removed file is a broken link. The tree is committed; after
    # adding or removing a top-level entry of datastore/, `python typecheck/make_links.py` rewrites it.
    tree = REPO / "typecheck"
    remedy = "(run python typecheck/make_links.py and commit typecheck/dstore)"
    wrong = [
        str(p.relative_to(REPO))
        for p in _source_files(*FOLDERS)
        if (tree / FOLDERS[p.relative_to(REPO).parts[0]] / Path(*p.relative_to(REPO).parts[1:])).resolve() != p
    ]
    assert not wrong, f"modules the type check does not reach by their import name {remedy}: {wrong}"
    broken = [str(p.relative_to(REPO)) for p in (tree / "dstore").iterdir() if not p.exists()]
    assert not broken, f"links to files that are gone {remedy}: {broken}"
    assert all(p.is_symlink() for p in (tree / "dstore").iterdir()), f"typecheck/dstore holds links only {remedy}"


def test_the_import_paths_the_docs_showed_still_work(tmp_path):
    # Issue 30 moved the flat modules into subpackages; a user's script written against the old
    # paths the docs showed keeps working, gets the very same objects, and `import dstore` stays light.
    code = (
        "import sys, dstore\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'mpi4py')]\n"
        "from dstore.store import DataStore, Batch\n"  # rename_modules: keep
        "from dstore.torch import StoreLoader, decode_channels\n"  # rename_modules: keep
        "from dstore.preemption import PREEMPTED_EXIT, Preemption\n"  # rename_modules: keep
        "from dstore.pagecache import evict\n"  # rename_modules: keep
        "import dstore.torch, dstore.loader.store_loader as new\n"  # rename_modules: keep
        "assert dstore.torch is new and StoreLoader is new.StoreLoader is dstore.StoreLoader\n"  # rename_modules: keep
        "import dstore.store.data_store, dstore.store.epoch\n"
        "assert DataStore is dstore.store.data_store.DataStore and Batch is dstore.store.epoch.Batch\n"
        "for old, new in dstore.MOVED.items():\n"
        "    assert sys.modules[old] is sys.modules[new], old\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stdout.split() == ["ok"], res.stderr
    for never_released in ("dstore.plan", "dstore.mixed", "dstore.draws", "dstore.collective"):  # rename_modules: keep
        with pytest.raises(ImportError):  # a path no release's docs showed is not kept
            __import__(never_released)
    import dstore.loader

    assert not hasattr(dstore.loader, "StoreLoader")  # dstore.loader.StoreLoader was never released


def test_sources_use_the_moved_modules_new_names():
    # typecheck/rename_modules.py rewrites every reference to a moved module; run on a tree that is
    # already current it changes nothing. A branch written against the old layout fails here until
    # the script is run again (the old public paths still import, so nothing else would say so).
    import importlib.util

    spec = importlib.util.spec_from_file_location("rename_modules", REPO / "typecheck" / "rename_modules.py")
    assert spec and spec.loader
    rename = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rename)
    lead_owned = {"docs/reliability.md"}  # assembled by the lead, who runs the script after merging
    stale = [
        rel
        for rel in rename.tracked_files()
        if rel not in lead_owned and rename.rewrite((REPO / rel).read_text()) != (REPO / rel).read_text()
    ]
    assert not stale, f"old module paths (run python typecheck/rename_modules.py): {stale}"
