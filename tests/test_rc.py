"""dstore.runtime.rc: every environment variable the project reads, in one module with one parser."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dstore.errors import ConfigError
from dstore.runtime import rc

REPO = Path(__file__).resolve().parent.parent


def _sources():
    return [
        p
        for d in ("datastore", "training", "tools", "tests")
        for p in (REPO / d).rglob("*.py")
        if "__pycache__" not in p.parts
    ]


def test_every_variable_named_in_the_sources_is_an_option_and_only_rc_reads_the_environment():
    named = set()
    readers = []
    for path in _sources():
        text = path.read_text()
        named |= set(re.findall(r"\bDSTORE_[A-Z_]+\b", text))
        if path.name == "rc.py":
            continue
        for node in ast.walk(ast.parse(text, str(path))):  # os.environ.get("DSTORE_...") / os.getenv(...)
            if (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("DSTORE_")
                and ast.unparse(node.func) in ("os.environ.get", "os.getenv", "environ.get")
            ):
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert named <= set(rc.OPTIONS), f"not in dstore.runtime.rc: {sorted(named - set(rc.OPTIONS))}"
    assert not readers, f"read outside dstore.runtime.rc: {readers}"


def test_the_guide_shows_the_generated_table():
    assert rc.options_table() in (REPO / "docs" / "guide.md").read_text()


@pytest.mark.parametrize(
    "text,value", [("", True), ("  ", True), ("1", True), ("ON", True), ("off", False), ("0", False), ("no", False)]
)
def test_one_boolean_parser_blank_is_the_default(text, value, monkeypatch):
    monkeypatch.setenv("DSTORE_NODE_VIEWS", text)
    assert rc.NODE_VIEWS.get() is value


@pytest.mark.parametrize(
    "option,text,allowed",
    [
        (rc.NODE_VIEWS, "maybe", "a boolean: True/False, or one of 1/true/yes/on/0/false/no/off"),
        (rc.RANKS_PER_NODE, "0", "an integer >= 1"),
        (rc.PROGRESS_PERIOD, "nan", "a finite number of seconds >= 0"),
        (rc.PROGRESS_PERIOD, "-1", "a finite number of seconds >= 0"),
    ],
)
def test_a_bad_value_names_the_variable(option, text, allowed, monkeypatch):
    monkeypatch.setenv(option.name, text)
    with pytest.raises(ConfigError) as err:
        option.get()
    assert str(err.value) == f"${option.name}={text!r} must be {allowed}"


def test_kinds_and_defaults(monkeypatch):
    monkeypatch.delenv("DSTORE_MEMORY_BUDGET", raising=False)
    monkeypatch.setenv("DSTORE_RANKS_PER_NODE", "3")
    monkeypatch.setenv("DSTORE_CACHE", "~/elsewhere")
    assert rc.MEMORY_BUDGET.get() is None and rc.RANKS_PER_NODE.get() == 3
    assert rc.CACHE.get() == str(Path("~/elsewhere").expanduser())
    monkeypatch.setenv("DSTORE_MEMORY_BUDGET", "2K")
    assert rc.MEMORY_BUDGET.get() == 2000
    monkeypatch.delenv("DSTORE_CACHE")
    assert rc.CACHE.get() == str(Path("~/.cache/dstore").expanduser())
