"""Command-line flags from a dataclass's fields: each field's `metadata` describes its flag.

The keys a field's metadata may hold (all optional):

* ``help``: plain text (a ``%`` is shown as is).
* ``group``: the title of the help section the flag is listed in (sections in order of first use).
* ``flags``: the option strings, where they differ from ``--field-name``; a bare name (no dash) makes
  the field a positional that may be left out.
* ``choices``: the allowed values.
* ``parse``: text -> value, for a type the annotation does not say how to read; it raises
  ValueError (ConfigError) with the message argparse shows.
* ``nargs``: a positional's argparse nargs (default ``?``: it may be left out).
* ``metavar``, and ``deprecated``: {old option string: new one} (the old one works, with a warning).
* ``flag``: False for a field that is not a flag.

The annotation gives the rest: ``int``/``float`` (also ``| None``) are read as such, ``str`` as is,
``bool`` (default False) is an on-switch, ``bool | None`` a ``--x/--no-x`` pair. The flag's default
is the field's default and its dest the field's name, so `from_args` builds the dataclass back.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import warnings

_READ = {"int": int, "float": float, "str": None}


class DeprecatedAlias(argparse.Action):
    """Stores the value; warns (on stderr, once per use) when given under an old option name."""

    def __init__(self, option_strings, dest, deprecated=None, **kwargs):
        self.deprecated = deprecated or {}
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            warnings.warn(
                f"{option_string} is deprecated: use {self.deprecated[option_string]}", FutureWarning, stacklevel=2
            )
        setattr(namespace, self.dest, values)


def flag_fields(cls) -> list[dataclasses.Field]:
    """The fields of dataclass `cls` that are flags, in order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag", True)]


def _kind(annotation) -> str:
    """An annotation as text without spaces (`int|None`), whether postponed (a string) or not."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace(" ", "")


def _argparse_type(parse):
    """`parse` as an argparse type: its ValueError becomes argparse's message for the flag."""

    @functools.wraps(parse)
    def read(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return read


def argument(field: dataclasses.Field) -> tuple[tuple[str, ...], dict]:
    """(option strings, add_argument keywords) of one field's flag.

    Raises:
        TypeError: the annotation does not say how to read the value and the field has no `parse`.
    """
    meta = field.metadata
    names = tuple(meta.get("flags") or ("--" + field.name.replace("_", "-"),))
    kw: dict = {"default": field.default}
    if meta.get("help") is not None:
        kw["help"] = meta["help"].replace("%", "%%")
    if names[0].startswith("-"):
        kw["dest"] = field.name
    else:
        kw["nargs"] = meta.get("nargs", "?")
    kind = _kind(field.type)
    if kind == "bool":
        kw["action"] = "store_true"
    elif kind == "bool|None":
        kw["action"] = argparse.BooleanOptionalAction
    else:
        if "parse" in meta:
            kw["type"] = _argparse_type(meta["parse"])
        elif kind.removesuffix("|None") in _READ:
            read = _READ[kind.removesuffix("|None")]
            if read is not None:
                kw["type"] = read
        else:
            raise TypeError(
                f"field {field.name!r}: how to read a {field.type} from the command line? "
                "give it a `parse` in its metadata"
            )
        for key in ("choices", "metavar"):
            if key in meta:
                kw[key] = meta[key]
    if "deprecated" in meta:
        kw["action"] = DeprecatedAlias
        kw["deprecated"] = meta["deprecated"]
    return names, kw


def add_fields(parser: argparse.ArgumentParser, cls) -> dict[str, argparse._ArgumentGroup]:
    """Adds a flag per field of dataclass `cls` that is one; returns the help sections by title."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in flag_fields(cls):
        title = field.metadata.get("group")
        if title is not None and title not in groups:
            groups[title] = parser.add_argument_group(title)
        names, kw = argument(field)
        (groups[title] if title is not None else parser).add_argument(*names, **kw)
    return groups


def from_args(cls, args: argparse.Namespace, **extra):
    """`cls` built from the parsed flags of its fields (and `extra` for the others)."""
    return cls(**{f.name: getattr(args, f.name) for f in flag_fields(cls)}, **extra)


def given(parser: argparse.ArgumentParser, sub: argparse.ArgumentParser, argv) -> set[str]:
    """The dests of subcommand parser `sub`'s flags that `argv` gives on the command line (parsed
    by `parser`, which dispatches to `sub`): `sub`'s defaults are suppressed for one more parse, so
    only what the command line says is set. (`dstore train --resume` takes the others from the run.)"""
    saved = [(a, a.default) for a in sub._actions]
    defaults, sub._defaults = sub._defaults, {}
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        namespace = parser.parse_args(argv)
    finally:
        sub._defaults = defaults
        for action, default in saved:
            action.default = default
    return {a.dest for a, _ in saved if a.dest != "help" and hasattr(namespace, a.dest)}
