"""`dstore train`'s flags come from TrainConfig's fields (dstore.tools.flags): the parser and the
config cannot drift apart: the same names, defaults and choices, and the help renders."""

import argparse
import dataclasses
from typing import Any

import pytest

from dstore.errors import ConfigError
from dstore.order import policy, tiers
from dstore.tools import flags
from dstore.tools.cli import build_parser
from dstore.training import config, dist, ltfb, optim
from dstore.training.config import TrainConfig


def _train_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_every_config_field_that_is_a_flag_is_in_the_parser_with_its_default_and_choices():
    parser = _train_parser()
    by_dest = {a.dest: a for a in parser._actions}
    fields = flags.flag_fields(TrainConfig)
    assert len(fields) == len(dataclasses.fields(TrainConfig)) - 1  # all but runs_root
    assert "runs_root" not in by_dest
    for f in fields:
        action = by_dest[f.name]
        assert action.default == f.default, f.name
        assert action.choices == f.metadata.get("choices"), f.name
        names = f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)
        assert set(names) <= set(action.option_strings) or action.option_strings == [], f.name
    # and nothing else: the parser's own --help, --json (how the summary is printed, not the run), and
    # --config / --print-config (where the flags come from, and showing them instead of a run)
    assert set(by_dest) - {f.name for f in fields} == {"help", "json", "config", "print_config"}
    # no flags given: the config's own defaults, field for field
    assert flags.from_args(TrainConfig, parser.parse_args([])) == TrainConfig()
    text = " ".join(parser.format_help().split())  # the help renders (argparse formats lazily)
    for action in parser._actions:
        for name in action.option_strings:
            assert name in text
    assert "70% of the node's available memory" in text and "%%" not in text
    assert "--epochs EPOCHS (default: 15)" in text  # a flag without help states its default


def test_a_choice_set_is_one_constant_for_the_flag_and_the_check():
    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(TrainConfig)}
    assert choices["shuffle"] is policy.NAMES and choices["population"] is tiers.POPULATIONS
    assert choices["overflow"] is tiers.OVERFLOWS and choices["device"] is dist.DEVICES
    assert choices["optimizer"] is optim.OPTIMIZERS and choices["schedule"] is optim.SCHEDULES
    assert choices["ltfb_metric"] is ltfb.METRICS and choices["ltfb_strategy"] is ltfb.STRATEGIES
    assert choices["loader"] is config.LOADERS and choices["augment"] is config.AUGMENTS
    for name, allowed in (
        ("loader", config.LOADERS),
        ("augment", config.AUGMENTS),
        ("ltfb_metric", ltfb.METRICS),
        ("ltfb_strategy", ltfb.STRATEGIES),
    ):
        for value in allowed:
            good: dict[str, Any] = {name: value}  # the field named by `name`
            TrainConfig(**good).check()
        bad: dict[str, Any] = {name: "nope"}
        with pytest.raises(ConfigError, match=name.replace("_", ".")):
            TrainConfig(**bad).check()


def _sides(text: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{text!r} is not two numbers") from None
    return a, b


def test_flags_from_a_dataclass():
    @dataclasses.dataclass
    class Options:
        path: str | None = dataclasses.field(default=None, metadata={"flags": ("path",), "help": "where"})
        count: int = dataclasses.field(default=3, metadata={"group": "sizes", "choices": (3, 4)})
        share: float | None = dataclasses.field(default=None, metadata={"group": "sizes"})
        sides: tuple = dataclasses.field(default=(1, 1), metadata={"parse": _sides})
        loud: bool = False
        colour: bool | None = None
        hidden: list = dataclasses.field(default_factory=list, metadata={"flag": False})

    parser = argparse.ArgumentParser(prog="x", exit_on_error=False)
    groups = flags.add_fields(parser, Options)
    assert list(groups) == ["sizes"]
    args = parser.parse_args(["p", "--count", "4", "--share", "0.5", "--sides", "2,5", "--loud", "--no-colour"])
    assert flags.from_args(Options, args, hidden=[1]) == Options("p", 4, 0.5, (2, 5), True, False, [1])
    assert flags.from_args(Options, parser.parse_args([])) == Options()
    with pytest.raises(argparse.ArgumentError, match="argument --sides: '2,x' is not two numbers"):
        parser.parse_args(["--sides", "2,x"])


def test_a_field_the_parser_cannot_read_is_refused_by_name():
    @dataclasses.dataclass
    class Bad:
        sizes: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="field 'sizes'"):
        flags.add_fields(argparse.ArgumentParser(), Bad)


def test_the_parsers_messages_name_the_value(capsys):
    parse = _train_parser().parse_args
    assert parse(["--memory-budget", "512MiB", "--image-size", "16x24", "--mean", "0.5,0.4"]).memory_budget == 512 << 20
    for argv, message in (
        (["--mean", "1,x"], "'1,x' is not a comma-separated list of numbers"),
        (["--image-size", "3x4x5"], "'3x4x5' is not N or HxW"),
        (["--memory-budget", "8X"], "--memory-budget='8X' is not a size"),
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        assert f"error: argument {argv[0]}: {message}" in capsys.readouterr().err
