"""`--config FILE`: a command's flags from a YAML or JSON file, under what the command line says.

The file is a mapping of flag names (`batch_size` or `batch-size`) to values; the `config.json` a
training run writes (`{"config": {...}, "model": ..., ...}`) is read as its "config" part, so a run
can be started again from it (but for its `run_dir` and `resume`, which name that run, not how it
trains: the new run gets a directory of its own unless the command line names one). Every key
must name a flag of the command (else an error naming the file and the key, with the closest
name); every value is checked as the flag would check it (its
type, its choices, its `parse`). The values become the parser's defaults, so any flag given on the
command line wins. Plain argparse and PyYAML, not jsonargparse: the flags are already built from
one dataclass (dstore.tools.flags), and this is all a file adds to them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os

from dstore.errors import ConfigError
from dstore.runtime import values

RUN_RECORD_ONLY = ("run_dir", "resume", "runs_root", "overwrite")
"""Keys of a run's config.json that say where that run was, not how to train: not taken from it."""


def read(path: str) -> dict:
    """The mapping in the YAML or JSON file at `path` (by its extension; else JSON, then YAML).

    Raises:
        ConfigError: the file cannot be read or parsed, or does not hold a mapping.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc.strerror or exc}") from None
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".json" or (ext not in (".yaml", ".yml") and text.lstrip().startswith("{")):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise ConfigError(f"--config {path}: not valid JSON: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and its kin; the file's fault, named as such
        raise ConfigError(f"--config {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: holds a {type(data).__name__}, not a mapping of flag names to values")
    if isinstance(data.get("config"), dict):  # a run's config.json: its flags are under "config"
        data = {k: v for k, v in data["config"].items() if k not in RUN_RECORD_ONLY}
    return data


def _actions_by_dest(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's value-taking options by dest (positionals too), but --config itself and --help."""
    return {
        a.dest: a
        for a in parser._actions
        if a.dest not in ("help", "config", "print_config") and a.default is not argparse.SUPPRESS
    }


def _value(action: argparse.Action, key: str, value, path: str):
    """`value` as the flag `action` would have it, or ConfigError naming the file and the key."""
    where = f"--config {path}: {key}={value!r}"
    if value is None:
        return None
    if action.nargs == 0:  # an on-switch (store_true) or a --x/--no-x pair
        return values.boolean(f"--config {path}: {key}", value)  # one rule for every boolean
    if action.nargs == "*" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [action.type(v) if callable(action.type) else v for v in value]  # a mix's containers
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        value = ",".join(str(v) for v in value) if key != "image_size" else "x".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where}: a {type(value).__name__} is not a value of --{key.replace('_', '-')}")
    if callable(action.type):
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            if action.type in (int, float):
                raise ConfigError(f"{where}: not a valid {action.type.__name__}") from None
            raise ConfigError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{where} is not one of {', '.join(map(str, action.choices))}")
    return value


def apply(parser: argparse.ArgumentParser, path: str) -> dict:
    """Makes the file's values the defaults of `parser`'s flags; returns them (by dest).

    Args:
        parser: the command's parser (a subparser of `dstore`).
        path: the YAML or JSON file.

    Raises:
        ConfigError: naming the file and the first key that is no flag, or whose value is not allowed.
    """
    values = read_values(parser, path)
    parser.set_defaults(**values)
    return values


def read_values(parser: argparse.ArgumentParser, path: str) -> dict:
    """The file's values by dest, each as its flag of `parser` would have it (see `apply`).

    Raises:
        ConfigError: naming the file and the first key that is no flag, or whose value is not allowed.
    """
    actions = _actions_by_dest(parser)
    values = {}
    for key, value in read(path).items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in actions:
            close = difflib.get_close_matches(dest, list(actions), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"--config {path}: {key!r} is not a flag of this command{hint}")
        values[dest] = _value(actions[dest], dest, value, path)
    return values
