"""Every dotted name docs/design.md gives in backticks (`decode.decode_crop`, `StoreLoader.state_dict`,
`dstore.runtime.rc`) names something that exists in the code, found from the sources (no import)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"datastore": "dstore", "training": "dstore.training", "tools": "dstore.tools"}
# Names that are not the project's (a library's), checked by hand; every other dotted name is the project's.
FOREIGN = {"MPI.Win", "Win.Free", "torch.load", "torch.save"}
PLACEHOLDER = "x"  # `dstore.x` in "`datastore/x.py` is `dstore.x`"
FILE_SUFFIXES = (
    ".py",
    ".md",
    ".json",
    ".c",
    ".so",
    ".pyi",
    ".toml",
    ".sh",
    ".h5",
    ".zarr",
    ".yaml",
    ".txt",
    ".jsonl",
    ".csv",
    ".png",
    ".npy",
    ".npz",
    ".tar",
    ".jpg",
    ".JPEG",
    ".pt",
    ".gz",
)


class _Module:
    """A source file's names: top-level (defs, classes, assignments, imports) and each class's members."""

    def __init__(self, path: Path):
        tree = ast.parse(path.read_text())
        self.names: set[str] = set()
        self.members: dict[str, set[str]] = {}
        for node in tree.body:
            self._top(node)

    def _top(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            self.names.add(node.name)
            members = self.members.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    members.add(sub.id)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    members.add(sub.attr)  # self.x = ...
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name):
                        self.names.add(sub.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in (
                node.body + getattr(node, "orelse", []) + [n for h in getattr(node, "handlers", []) for n in h.body]
            ):
                self._top(sub)


def _modules() -> dict[str, _Module]:
    """Every module of the three folders by its dotted import name."""
    out = {}
    for folder, root in FOLDERS.items():
        for p in sorted((REPO / folder).rglob("*.py*")):
            if "__pycache__" in p.parts or p.suffix not in (".py", ".pyi"):
                continue
            rel = p.relative_to(REPO / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([root, *parts])] = _Module(p)
    return out


def _resolve(name: str, mods: dict[str, _Module], classes: dict[str, list[_Module]], moved: dict) -> bool:
    parts = name.split(".")
    if name in mods or name in moved:
        return True
    # the longest module prefix: a full dotted path (dstore.x.y) or a module's last component(s) (decode.f)
    for k in range(len(parts), 0, -1):
        head, rest = ".".join(parts[:k]), parts[k:]
        found = [m for key, m in mods.items() if key == head or key.endswith("." + head)]
        for m in found:
            if not rest:
                return True
            if rest[0] in m.names and (len(rest) == 1 or rest[1] in m.members.get(rest[0], ()) or len(rest) > 2):
                return True
            sub = [key for key in mods if key == head + "." + rest[0] or key.endswith("." + head + "." + rest[0])]
            if sub:
                return True
        if found:
            return False
    # a class's member (`StoreLoader.state_dict`)
    return len(parts) == 2 and any(parts[1] in m.members.get(parts[0], ()) for m in classes.get(parts[0], ()))


def test_every_dotted_name_in_design_md_exists():
    text = (REPO / "docs" / "design.md").read_text()
    mods = _modules()
    classes: dict[str, list[_Module]] = {}
    for m in mods.values():
        for c in m.members:
            classes.setdefault(c, []).append(m)
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        span = re.sub(r"\(.*\)$", "", span.strip())
        if (
            re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", span)
            and not span.endswith(FILE_SUFFIXES)
            and span not in FOREIGN
            and PLACEHOLDER not in span.split(".")
        ):
            names.add(span)
    assert len(names) > 50, f"too few names found to check ({len(names)}): the pattern no longer matches"
    import dstore  # light: no torch, no MPI

    missing = sorted(n for n in names if not _resolve(n, mods, classes, dstore.MOVED))
    assert not missing, f"docs/design.md names what the code does not have: {missing}"
