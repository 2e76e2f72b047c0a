"""Every flag of `dstore plan` bounded: a value out of its range is refused in one line naming the
flag, the value and what is allowed (never a traceback, never printed as a recommendation); and the
forecast's library inputs (dstore.memory.capacity) alike."""

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.errors import ConfigError, DStoreError
from dstore.memory import capacity
from dstore.tools import cmd_plan
from dstore.tools.cli import build_parser

BASE = ["--samples", "20000", "--mean-bytes", "100KB"]

# flag -> [(its bad value(s), the message's text)]; argparse refusals (not a number) say so themselves
BAD = {
    "container": [(["nowhere.h5"], "nowhere.h5: no such container"), (["nowhere.h5", "--samples", "5"], "not both")],
    "--samples": [
        (["0"], "--samples=0 must be an integer >= 1"),
        (["-3"], "--samples=-3 must be an integer >= 1"),
        ([str(2**63)], f"--samples={2**63} must be at most {2**63 - 1}"),
    ],
    "--mean-bytes": [
        (["0"], "--mean-bytes=0 must be a finite number > 0"),
        (["-1KB"], "--mean-bytes='-1KB' is not"),
        (["1e400"], "--mean-bytes='1e400' is too large"),
        (["nan"], "--mean-bytes='nan' is not a size"),
    ],
    "--nodes": [(["0"], "--nodes=0 must be an integer >= 1"), (["2", "-1"], "--nodes=-1 must be an integer >= 1")],
    "--ranks-per-node": [(["0"], "--ranks-per-node=0 must be an integer >= 1")],
    "--memory-per-node": [
        (["0"], "--memory-per-node=0 must be a finite number > 0"),
        (["1e400G"], "--memory-per-node='1e400G' is too large"),
    ],
    "--memory-budget": [
        (["0"], "--memory-budget=0 must be a finite number > 0"),
        (["-5G"], "--memory-budget='-5G' is not a size"),
    ],
    "--storage-lookahead": [(["-1"], "--storage-lookahead=-1 must be an integer >= 0")],
    "--network": [([v], f"--network={float(v)!r} must be a finite number > 0") for v in ("0", "-1", "inf", "nan")]
    + [(["1e22"], "--network=1e+22 must be at most 1e+21")],
    "--storage": [
        (["nfs"], "storage 'nfs': expected pfs:KEY=VALUE"),
        (["pfs:latency=-1ms"], "latency='-1ms'"),
        (["pfs:jitter=nan"], "jitter=nan must be in [0, 1]"),
        (["pfs:iops=1e31"], "--storage pfs:iops=1e31: iops=1e+31 must be at most 1e+30 (or inf: no cap)"),
    ],
    "--local-bandwidth": [
        (["0MB/s"], "--local-bandwidth='0MB/s' must be > 0"),
        (["nan"], "--local-bandwidth='nan': expected bytes per second"),
        (["1e400B/s"], "--local-bandwidth='1e400B/s': expected bytes per second"),
        (["1e31B/s"], "--local-bandwidth=1e+31 must be at most 1e+30 (or inf: no cap)"),
    ],
    "--consume": [([v], f"--consume={float(v)!r} must be a finite number > 0") for v in ("0", "-1", "inf", "nan")]
    + [(["1e31"], "--consume=1e+31 must be at most 1e+30"), (["1e-31"], "--consume=1e-31 must be at least 1e-30")],
    "--batch-size": [
        (["0"], "--batch-size=0 must be an integer >= 1"),
        (["4"], "--batch-size=4 is the global batch size and must be >= the number of ranks (8"),
    ],
    "--threads": [
        (["0"], "--threads=0 must be an integer >= 1"),
        ([str(2**64)], "must be at most 9223372036854775807"),
    ],
    "--workers": [(["-2"], "--workers=-2 must be an integer >= 0")],
    "--decode-ms": [([v], f"--decode-ms={float(v)!r} must be a finite number >= 0") for v in ("-5", "nan", "inf")]
    + [(["1e31"], "--decode-ms=1e+31 must be at most 1e+30")],
    "--bench": [
        (["BENCH_MISSING"], "not a `dstore bench` results.json (FileNotFoundError"),
        (["BENCH_GARBAGE"], "not a `dstore bench` results.json (JSONDecodeError"),
        (["BENCH_NEGATIVE"], "measurement 0's seconds=-1.0 must be a finite number > 0"),
        (["BENCH_NO_BYTES"], "its measured disk bandwidth (bytes/s)=0.0 must be a finite number > 0"),
    ],
}
NO_VALUE = {"--json": "a switch: nothing to bound", "-h": "help", "--help": "help"}
NOT_A_NUMBER = [
    ("--samples", "1.5"),
    ("--nodes", "x"),
    ("--workers", "two"),
    ("--threads", "1e3"),
    ("--network", "fast"),
    ("--consume", "x"),
    ("--decode-ms", "4ms"),
    ("--batch-size", "nan"),
    ("--ranks-per-node", "1.0"),
    ("--storage-lookahead", "inf"),
]


def _plan_parser():
    parser = build_parser()
    args = parser.parse_args(["plan", *BASE])
    return parser, args.command_parser


def _bench_files(tmp_path) -> dict:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    negative = tmp_path / "negative.json"
    negative.write_text(
        json.dumps({"measurements": [{"cache": "cold", "group": "population", "seconds": [-1.0], "nbytes": [1000]}]})
    )
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"cache": "cold", "group": "limit", "seconds": [2.0], "nbytes": [0]}]))
    return {
        "BENCH_MISSING": str(tmp_path / "missing.json"),
        "BENCH_GARBAGE": str(garbage),
        "BENCH_NEGATIVE": str(negative),
        "BENCH_NO_BYTES": str(empty),
    }


def test_the_table_covers_every_flag_of_dstore_plan():
    _, sub = _plan_parser()
    flags = {a.option_strings[0] if a.option_strings else a.dest for a in sub._actions}
    flags |= {s for a in sub._actions for s in a.option_strings}
    assert flags - set(NO_VALUE) == set(BAD), "a flag of `dstore plan` without its bounds in the table"
    assert {f for f, _ in NOT_A_NUMBER} <= set(BAD)


@pytest.mark.parametrize("flag, values, msg", [(f, v, m) for f, rows in BAD.items() for v, m in rows])
def test_a_value_out_of_its_range_is_refused_naming_the_flag(flag, values, msg, tmp_path):
    values = [_bench_files(tmp_path).get(v, v) for v in values]
    # FLAG=VALUE: argparse would take a lone `-1KB` for an option
    argv = values if flag == "container" else [f"{flag}={values[0]}"] if len(values) == 1 else [flag, *values]
    base = [] if flag == "container" else BASE
    if flag in ("--samples", "--mean-bytes"):
        base = [x for x in BASE if x not in (flag, "20000" if flag == "--samples" else "100KB")]
    parser, _ = _plan_parser()
    args = parser.parse_args(["plan", *base, *argv])
    with pytest.raises(DStoreError) as err:
        cmd_plan.run(args)
    assert msg in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flag, value", NOT_A_NUMBER)
def test_a_value_that_is_not_a_number_of_its_kind_is_refused_by_the_parser(flag, value, capsys):
    parser, _ = _plan_parser()
    with pytest.raises(SystemExit) as code:
        parser.parse_args(["plan", *BASE, flag, value])
    assert code.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_the_command_prints_one_line_and_no_traceback():
    # what the issue saw: `--consume inf` and `--decode-ms nan` were tracebacks
    for bad in (["--consume", "inf"], ["--decode-ms", "nan"], ["--workers", "-2"]):
        out = subprocess.run(
            [sys.executable, "-m", "dstore.tools", "plan", *BASE, *bad], capture_output=True, text=True, timeout=60
        )
        assert out.returncode != 0 and out.stdout == "", out
        assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("dstore: error: ConfigError: " + bad[0])


def test_boundary_values_are_accepted():
    # 0 decode workers (the rank decodes), 0 ms decode, 0 storage lookahead: allowed, and printed as given
    parser, _ = _plan_parser()
    args = parser.parse_args(
        [
            "plan",
            *BASE,
            "--workers",
            "0",
            "--decode-ms",
            "0",
            "--storage-lookahead",
            "0",
            "--local-bandwidth",
            "unlimited",
            "--json",
        ]
    )
    assert cmd_plan.run(args) == 0


def test_the_library_bounds_every_input_of_a_forecast():
    ok = capacity.Cluster(nodes=1, ranks_per_node=2, memory_per_node=1e9, batch_size=8)
    bad = {
        "nodes": 1.5,
        "ranks_per_node": 0,
        "memory_per_node": math.inf,
        "network": -1.0,
        "consume": math.nan,
        "batch_size": True,
        "threads": 0,
        "prefetch": -1,
        "workers": -2,
        "decode_seconds": -0.001,
        "local_bandwidth": math.nan,
        "memory_budget": 0.0,
        "storage_lookahead": -1,
        "storage_threads": 0,
        "reader_index_bytes": -1.0,
        "decode_threads": -1,
        "input_shape": (224, 0, 3),
    }
    import dataclasses

    assert set(bad) | {"trainer", "image_shape"} == {f.name for f in dataclasses.fields(capacity.Cluster)}
    for name, value in bad.items():
        with pytest.raises(ConfigError, match=rf"^{name}="):
            capacity.forecast(100, 1e3, dataclasses.replace(ok, **{name: value}), capacity.Storage())
    for storage, name in (
        (capacity.Storage(latency=-1e-3), "storage.latency"),
        (capacity.Storage(iops=0), "storage.iops"),
        (capacity.Storage(bandwidth=math.nan), "storage.bandwidth"),
    ):
        with pytest.raises(ConfigError, match=rf"^{name}="):
            capacity.forecast(100, 1e3, ok, storage)
    for samples, mean in ((0, 1e3), (2.5, 1e3), (100, math.inf), (100, 0)):
        with pytest.raises(ConfigError, match="^samples=|^mean_bytes="):
            capacity.forecast(samples, mean, ok, capacity.Storage())  # pyright: ignore[reportArgumentType] - 2.5 refused
    # no cap is inf where a rate has one: unlimited local disk and storage are allowed
    capacity.forecast(100, 1e3, dataclasses.replace(ok, local_bandwidth=math.inf), capacity.Storage())


def test_a_local_disk_is_priced_from_its_bandwidth():
    # 2 GB on one rank with a 1 GB budget: half read from the local disk each epoch; the step's
    # storage time is its bytes over the disk's bandwidth (was 0 whatever the disk)
    def f(bw):
        cl = capacity.Cluster(
            nodes=1,
            ranks_per_node=1,
            memory_per_node=1e12,
            memory_budget=1e9,
            batch_size=64,
            local_bandwidth=bw,
            trainer=False,
        )
        return capacity.forecast(20_000, 100e3, cl, capacity.Storage())["step"]

    slow, fast = f(100e6), f(200e6)
    assert slow["storage_bytes"] > 0
    assert slow["storage_seconds"] == pytest.approx(slow["storage_bytes"] / 100e6)
    assert fast["storage_seconds"] == pytest.approx(slow["storage_seconds"] / 2)
    assert f(math.inf)["storage_seconds"] == 0.0


def test_a_bench_file_replaces_the_disk_and_decode_figures(tmp_path):
    # 1 GB read cold in 2 s (500 MB/s) and 500 samples decoded in 1 s (2 ms each)
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "measurements": [
                    {"cache": "cold", "group": "population", "seconds": [2.0], "nbytes": [1e9]},
                    {"group": "decode", "seconds": [1.0], "samples": [500]},
                ]
            }
        )
    )
    parser, _ = _plan_parser()
    args = parser.parse_args(["plan", *BASE, "--ranks-per-node", "1", "--bench", str(path), "--json"])
    assert cmd_plan._from_bench(str(path)) == (5e8, 2e-3)
    inputs = cmd_plan._inputs(args)
    assert inputs["local_bandwidth"] == 5e8 and inputs["decode_seconds"] == 2e-3


def _figure(low=0.0, strict=False):
    """A figure in check_number's range: [low, MAX_FIGURE], and at least 1/MAX_FIGURE where > 0."""
    return st.floats(1 / capacity.MAX_FIGURE if strict else low, capacity.MAX_FIGURE)


@settings(max_examples=200)
@given(st.data())
def test_any_inputs_in_their_ranges_give_a_forecast_of_numbers(data):
    # the bounds are the forecast's domain: from one end to the other, no overflow, no NaN
    count = st.integers(1, capacity.MAX_COUNT)
    nodes, rpn = data.draw(st.integers(1, 2**20)), data.draw(st.integers(1, 2**10))
    cl = capacity.Cluster(
        nodes=nodes,
        ranks_per_node=rpn,
        memory_per_node=data.draw(_figure(0, True)),
        network=data.draw(_figure(0, True)),
        consume=data.draw(_figure(0, True)),
        batch_size=data.draw(st.integers(nodes * rpn, capacity.MAX_COUNT)),
        threads=data.draw(count),
        prefetch=data.draw(st.integers(0, capacity.MAX_COUNT)),
        workers=data.draw(st.none() | st.integers(0, capacity.MAX_COUNT)),
        decode_seconds=data.draw(_figure()),
        local_bandwidth=data.draw(_figure(0, True) | st.just(math.inf)),
        memory_budget=data.draw(st.none() | _figure(0, True)),
        storage_lookahead=data.draw(st.integers(0, 2**40)),
        storage_threads=data.draw(count),
        reader_index_bytes=data.draw(_figure()),
        trainer=data.draw(st.booleans()),
        decode_threads=data.draw(st.integers(0, 2**20)),
        input_shape=data.draw(st.tuples(count, st.integers(1, 2**20), st.integers(1, 4))),
        image_shape=data.draw(st.tuples(st.integers(1, 2**20), st.integers(1, 2**20), st.integers(1, 4))),
    )
    storage = capacity.Storage(
        latency=data.draw(_figure()),
        iops=data.draw(_figure(0, True) | st.just(math.inf)),
        bandwidth=data.draw(_figure(0, True) | st.just(math.inf)),
    )
    f = capacity.forecast(data.draw(count), data.draw(_figure(1)), cl, storage)

    def numbers(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from numbers(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield x

    assert all(not math.isnan(x) for x in numbers(f))
    capacity.format_forecast(f)
