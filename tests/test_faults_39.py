"""Faults at the new surfaces (issue 39): one rule for booleans and numbers in every config, labels that
cannot be classes, waits on object storage, a failing iterable on rank 0, own scripts' errors.

Every case ends with the right result or one line, a bound on its time set by its timeout (a hang is a
failure that prints the output), and no process left behind (each command is run to its end)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI
from support.formats import one_line_error
from support.mpirun import REPO

from dstore.errors import ConfigError

BOUND_S = 60
"""What any one command of these tests may take before it counts as a hang (they take a few seconds)."""


def dstore(*args, cwd=None, env=None, timeout=BOUND_S) -> subprocess.CompletedProcess:
    """`dstore ARGS` as a separate process (one rank); a hang fails the test with its output."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "dstore.tools", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"HANG: dstore {' '.join(map(str, args))} did not finish in {timeout}s\n"
            f"--- stdout ---\n{exc.stdout}\n--- stderr ---\n{exc.stderr}"
        ) from None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three small JPEG containers (20 samples each, different seeds) in one folder."""
    from dstore.ingest import ingest

    root = tmp_path_factory.mktemp("c39")
    for name, seed in (("a.h5", 0), ("b.h5", 1), ("c.h5", 2)):
        ingest("synthetic", str(root / name), comm=MPI.COMM_SELF, count=20, seed=seed, progress=False)
    return root


# --- item 2: one rule for booleans, integers and numbers ------------------------------------------------

FALSE_TEXTS = ["false", "no", "0", "off", " False ", 0, np.bool_(False)]


@pytest.mark.parametrize("text", FALSE_TEXTS)
def test_a_false_text_is_false_in_every_config_object(text):
    from dstore.ingest.config import IngestConfig
    from dstore.loader.config import LoaderConfig
    from dstore.store.config import StoreConfig
    from dstore.training.config import TrainConfig

    store = StoreConfig(batch_size=4, drop_last=text, replicate=text, node_views=text).checked(1)
    assert (store.drop_last, store.replicate, store.node_views) == (False, False, False)
    ingest = IngestConfig(overwrite=text, keep_order=text, progress=text, stratify=text).checked()
    assert (ingest.overwrite, ingest.keep_order, ingest.progress, ingest.stratify) == (False,) * 4
    assert LoaderConfig(pin_memory=text).checked().pin_memory is False
    train = TrainConfig(drop_last=text, nesterov=text, deterministic=text, progress=text)
    train.check()
    assert (train.drop_last, train.nesterov, train.deterministic, train.progress) == (False,) * 4


@pytest.mark.parametrize(
    "make",
    [
        lambda v: __import__("dstore.store.config", fromlist=["x"]).StoreConfig(batch_size=4, drop_last=v).checked(1),
        lambda v: __import__("dstore.ingest.config", fromlist=["x"]).IngestConfig(overwrite=v).checked(),
        lambda v: __import__("dstore.loader.config", fromlist=["x"]).LoaderConfig(pin_memory=v).checked(),
        lambda v: __import__("dstore.training.config", fromlist=["x"]).TrainConfig(nesterov=v).check(),
    ],
    ids=["StoreConfig", "IngestConfig", "LoaderConfig", "TrainConfig"],
)
@pytest.mark.parametrize("bad", ["maybe", 2, 0.0, [], "nein"])
def test_a_value_that_is_no_boolean_is_one_line_naming_the_option(make, bad):
    with pytest.raises(ConfigError, match=r"^(drop_last|overwrite|pin_memory|nesterov)=.* must be a boolean"):
        make(bad)


def test_overwrite_false_as_text_keeps_an_existing_container(small, tmp_path):
    # the red team's case: IngestConfig(overwrite="false") replaced an existing container
    from dstore.formats import ContainerExistsError
    from dstore.ingest import ingest
    from dstore.ingest.config import IngestConfig

    out = tmp_path / "x.h5"
    ingest("synthetic", str(out), comm=MPI.COMM_SELF, count=8, progress=False)
    before = out.read_bytes()
    with pytest.raises(ContainerExistsError):
        ingest(
            "synthetic",
            str(out),
            comm=MPI.COMM_SELF,
            config=IngestConfig(count=4, overwrite="false", progress="no"),  # pyright: ignore[reportArgumentType] - text where a bool belongs: read as false
        )
    assert out.read_bytes() == before


def test_drop_last_no_and_replicate_false_as_text_serve_every_sample(small):
    from dstore.store.data_store import DataStore

    path = str(small / "a.h5")  # 20 samples in batches of 8: the last one short
    with DataStore(MPI.COMM_SELF, path, batch_size=8, drop_last="no", replicate="False") as st:
        got = np.concatenate([b.ids for b in st.epoch(0)])
        assert st.config.replicate is False and st.config.drop_last is False
    assert sorted(got.tolist()) == list(range(20))


def test_a_boolean_in_a_config_file_and_an_environment_variable_follow_the_same_rule(tmp_path, monkeypatch):
    from dstore.runtime import rc
    from dstore.tools.cli import build_parser
    from dstore.tools.config_file import read_values

    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    for text, want in (("no", False), ("'false'", False), ("'yes'", True), ("1", True)):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"drop_last: {text}\n")
        assert read_values(train, str(cfg))["drop_last"] is want
        monkeypatch.setenv("DSTORE_NODE_VIEWS", text.strip("'"))
        assert rc.NODE_VIEWS.get() is want
    cfg.write_text("drop_last: maybe\n")
    with pytest.raises(ConfigError, match="drop_last='maybe' must be a boolean"):
        read_values(train, str(cfg))


@pytest.mark.parametrize(
    "seed,what", [(-1, "-1"), (2**64, "18446744073709551616"), ("x", "'x'"), (1.5, "1.5"), (True, "True")]
)
def test_a_bad_seed_is_one_line_naming_seed_in_every_config(seed, what):
    from dstore.ingest.config import IngestConfig
    from dstore.store.config import StoreConfig
    from dstore.training.config import TrainConfig

    for check in (
        lambda: StoreConfig(batch_size=4, seed=seed).checked(1),
        lambda: IngestConfig(seed=seed).checked(),
        lambda: TrainConfig(seed=seed).check(),
    ):
        with pytest.raises(
            ConfigError,
            match=rf"^(seed={what.replace('.', '[.]')} must be an integer|--seed {what} "
            rf"must be in \[0, 2147483648\))",
        ):
            check()


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_dstore_ingest_with_a_seed_out_of_range_is_one_line(tmp_path, seed):
    res = dstore("ingest", "synthetic", tmp_path / "s.h5", "--count", 4, "--seed", seed)
    one_line_error(res, f"seed={seed}", "[0, 2**63)")
    assert not (tmp_path / "s.h5").exists()


def test_dstore_train_with_a_weight_nan_or_inf_is_one_line(small):
    from dstore.training.data import parse_sources

    for weight in ("inf", "-inf", "-1", "nan"):
        with pytest.raises(ConfigError, match=r"^source 1 \(b.h5\): weight .* must be a finite number >= 0"):
            parse_sources(("a.h5:0.7", f"b.h5:{weight}"))
    res = dstore("train", small / "a.h5:0.7", f"{small / 'b.h5'}:nan", "--val", small / "c.h5", "--epochs", 1)
    one_line_error(res, "source 1", "b.h5", "weight nan must be a finite number >= 0")


def test_workers_and_prefetch_beyond_the_machine_are_refused_before_anything_starts(small):
    from dstore.loader.config import LoaderConfig
    from dstore.loader.store_loader import StoreLoader
    from dstore.store.data_store import DataStore
    from dstore.training.config import TrainConfig

    with pytest.raises(
        ConfigError,
        match=r"^workers=10000 decode worker processes are more than this machine "
        r"allows: at most \d+ \(4 per core of the \d+",
    ):
        LoaderConfig(workers=10**4).checked()
    with pytest.raises(ConfigError, match=r"^decode_workers=10000 decode worker processes"):
        TrainConfig(decode_workers=10**4).check()
    with pytest.raises(ConfigError, match=r"^prefetch=1000000000 must be an integer <= 1024"):
        DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4, prefetch=10**9)
    for name in ("storage_lookahead", "storage_threads", "population_threads"):
        with pytest.raises(ConfigError, match=rf"^{name}=100000 must be an integer <= 1024"):
            DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4, **{name: 10**5})
    with DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4) as st:
        children = _children()
        with pytest.raises(ConfigError, match="^workers=10000"):
            StoreLoader(st, None, size=8, workers=10**4)
        with pytest.raises(ConfigError, match="^ahead=100000 must be an integer <= 1024"):
            StoreLoader(st, None, config=LoaderConfig(ahead=10**5))
        assert _children() == children  # no process started


def _children() -> list[int]:
    """This process's child processes (by /proc)."""
    me = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(pid))
        except OSError:
            pass
    return sorted(out)


def test_ingest_config_fields_not_names_is_one_line_naming_fields():
    from dstore.ingest.config import IngestConfig

    for bad in (5, [1, 2], {"a": 1}.keys()):
        with pytest.raises(ConfigError, match="^fields=.* must be None"):
            IngestConfig(fields=bad).checked()
    assert IngestConfig(fields=["txt"]).checked().fields == ["txt"]


# --- item 3: labels ---------------------------------------------------------------------------------------


def _parquet(path, labels):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from support.ingest import jpeg_bytes

    pq.write_table(pa.table({"image": [jpeg_bytes(16, k) for k in range(len(labels))], "label": labels}), str(path))
    return str(path)


@pytest.mark.parametrize(
    "labels,kind",
    [([[2, 1], [10], [3]], "list"), ([{"a": 1}, {"a": 2}, {"a": 3}], "struct"), ([["x"], ["y"], ["x"]], "list")],
)
def test_a_list_or_struct_label_column_is_refused_in_one_line(tmp_path, labels, kind):
    from dstore.errors import SampleError
    from dstore.ingest import ingest

    src = _parquet(tmp_path / "t.parquet", labels)
    with pytest.raises(SampleError, match=rf"label .* is a {kind}, not a class index or name"):
        ingest(src, str(tmp_path / "t.h5"), comm=MPI.COMM_SELF, progress=False)
    assert not (tmp_path / "t.h5").exists()
    res = dstore("ingest", src, tmp_path / "t.h5")
    one_line_error(res, f"is a {kind}", "t.parquet")


def test_a_label_column_of_one_integer_lists_is_taken_as_integers_and_said(tmp_path):
    from dstore.formats import open_container
    from dstore.ingest import ingest

    src = _parquet(tmp_path / "t.parquet", [[2], [10], [3]])
    report = ingest(src, str(tmp_path / "t.h5"), comm=MPI.COMM_SELF, progress=False, keep_order=True)
    with open_container(str(tmp_path / "t.h5")) as c:
        assert list(c.labels) == [2, 10, 3] and len(c.info.class_names) == 11  # [10] is class 10, not class 0
    assert any("lists of one integer" in n for n in report.notes)


def test_a_labels_csv_naming_a_file_and_a_link_to_it_is_refused_as_one_file(tmp_path):
    from support.ingest import jpeg_bytes

    root = tmp_path / "imgs"
    root.mkdir()
    (root / "a.jpg").write_bytes(jpeg_bytes(16, 1))
    (root / "b.jpg").write_bytes(jpeg_bytes(16, 2))
    os.symlink("a.jpg", root / "link.jpg")
    (tmp_path / "two.csv").write_text("a.jpg,cat\nlink.jpg,dog\nb.jpg,dog\n")
    res = dstore("ingest", root, tmp_path / "x.h5", "--labels", tmp_path / "two.csv")
    one_line_error(res, "rows 1 and 2 list the same file ('a.jpg', 'link.jpg') with different labels")
    (tmp_path / "same.csv").write_text("a.jpg,cat\nlink.jpg,cat\nb.jpg,dog\n")
    res = dstore("ingest", root, tmp_path / "y.h5", "--labels", tmp_path / "same.csv")
    assert res.returncode == 0 and "wrote 2 samples" in res.stdout, res.stderr
    assert "row 2 ('link.jpg') repeats row 1 ('a.jpg')" in res.stdout + res.stderr


# --- item 5: rank 0's source raising anything ends the job ------------------------------------------------

SCRIPT = os.path.join(os.path.dirname(__file__), "faults_39_run.py")


@pytest.mark.mpi
@pytest.mark.parametrize(
    "mode,rank0,code",
    [("interrupt", "KeyboardInterrupt", None), ("exit", None, 3), ("error", "RuntimeError: the source broke", 1)],
)
def test_ingest_items_ends_the_job_when_rank_0s_iterable_raises_anything(tmp_path, mode, rank0, code):
    from support.mpirun import run_mpi

    res = run_mpi(2, ["python", SCRIPT, "items", mode, str(tmp_path / "out.h5")], timeout=BOUND_S, check=False)
    assert res.returncode != 0 and (code is None or res.returncode == code), res
    assert "not reached" not in res.stdout
    name = {"interrupt": "KeyboardInterrupt", "exit": "SystemExit: 3", "error": "RuntimeError: the source broke"}[mode]
    assert f"IngestError: rank 0 failed: {name}" in res.stderr, res.stderr  # rank 1 told, not left waiting
    if rank0 is not None:
        assert rank0 in res.stderr
    assert sorted(os.listdir(tmp_path)) == []  # no spool, no container left


# --- item 6: own scripts ---------------------------------------------------------------------------------


@pytest.mark.mpi
def test_an_agreed_error_at_an_epochs_start_in_an_own_script_is_one_line_once(small):
    from support.mpirun import run_mpi

    res = run_mpi(2, ["python", SCRIPT, "epochs", str(small / "a.h5")], timeout=BOUND_S, check=False)
    assert res.returncode != 0 and "not reached" not in res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dstore: error")]
    assert len(lines) == 1 and "ConfigError: ranks iterate different epochs" in lines[0], res.stderr


def test_close_keeps_the_hook_while_an_agreed_error_goes_up_and_gives_it_back_on_a_clean_close(small):
    from dstore.runtime import collective, job
    from dstore.store.data_store import DataStore

    holds = job._armed
    with pytest.raises(ConfigError, match="agreed"):
        with DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4):
            exc = ConfigError("agreed")
            collective._mark_agreed(exc)  # as every rank raises it after an agreement
            raise exc
    assert job._armed == holds + 1 and sys.excepthook is job._hook  # kept: the error prints once, ends the job
    job._armed -= 1  # give this test's hold back by hand (the process goes on to other tests)
    if job._armed == 0:
        sys.excepthook = job._previous or sys.__excepthook__
        job._previous = None
    with DataStore(MPI.COMM_SELF, str(small / "a.h5"), batch_size=4):
        pass
    assert job._armed == holds


def test_a_library_error_escapes_control_characters_in_a_file_name(tmp_path):
    from dstore.errors import SampleError
    from dstore.ingest import ingest_items

    with pytest.raises(SampleError) as err:
        ingest_items(
            [(b"not an image", 0, "x\x1b[2J\nOK.jpg")], str(tmp_path / "g.h5"), comm=MPI.COMM_SELF, progress=False
        )
    text = str(err.value)
    assert text.startswith("x\\x1b[2J\\nOK.jpg: not a valid image") and text.isprintable(), text


@pytest.mark.parametrize("name", ["label", "image"])
def test_a_field_named_like_a_batch_key_is_refused_at_ingest(tmp_path, name):
    from support.ingest import jpeg_bytes

    from dstore.ingest import ingest_items

    items = [(jpeg_bytes(16, k), k % 2, f"s{k}.jpg", {name: "x", "txt": "y"}) for k in range(4)]
    with pytest.raises(
        ConfigError,
        match=rf"^field '{name}': a batch with fields is .* could be stored but never "
        rf"served; leave it out",
    ):
        ingest_items(items, str(tmp_path / "f.h5"), comm=MPI.COMM_SELF, progress=False)
    assert not (tmp_path / "f.h5").exists()
    report = ingest_items(items, str(tmp_path / "f.h5"), comm=MPI.COMM_SELF, progress=False, fields=["txt"])
    assert report.samples == 4


def test_resume_with_config_json_missing_says_so(tmp_path):
    from dstore.training.resume import missing_run_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"")  # what a run leaves; its config.json is gone
    assert missing_run_config("auto", str(run), str(tmp_path)) == str(run / "config.json")
    (run / "config.json").write_text("{}")
    assert missing_run_config("auto", str(run), str(tmp_path)) is None
    os.remove(run / "config.json")
    res = dstore("train", "--resume", "auto", "--run-dir", run)
    one_line_error(res, "--resume auto", f"{run / 'config.json'} is missing", "give them again")


# --- item 4: every wait on object storage bounded ----------------------------------------------------------

STALL_ENV = {
    "DSTORE_OBJECT_TIMEOUT": "0.5",
    "DSTORE_OBJECT_TRIES": "2",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""A short bound for the tests: 0.5 s per wait, 2 tries (the defaults are 10 s and 3)."""

WAIT_LINE = "after no answer within 0.5 s, 2 tries ($DSTORE_OBJECT_TIMEOUT, $DSTORE_OBJECT_TRIES)"


@pytest.mark.parametrize(
    "args",
    [
        ("info", "s3://bk/c.h5"),
        ("verify", "s3://bk/c.h5"),
        ("info", "s3://bk/c.zarr"),
        ("ingest", "s3://bk/imgs", "{tmp}/out.h5"),
    ],
    ids=["info", "verify", "info-zarr", "ingest"],
)
def test_every_command_on_an_endpoint_that_never_answers_ends_with_one_line(tmp_path, args, capsys, monkeypatch):
    pytest.importorskip("s3fs")
    import fsspec
    from support.s3 import StallingProxy

    from dstore.tools.cli import main

    fsspec.get_filesystem_class("s3").clear_instance_cache()  # an instance made on another endpoint
    with StallingProxy() as silent:  # accepts, never answers
        for key, value in {**STALL_ENV, "AWS_ENDPOINT_URL": silent.url}.items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        code = main([a.format(tmp=tmp_path) for a in args])  # in this process: the bound is the wait, not imports
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert args[1] in err and "ReadTimeoutError" in err and WAIT_LINE in err, err


def test_dstore_train_on_an_endpoint_that_never_answers_ends_with_one_line(tmp_path):
    pytest.importorskip("s3fs")
    from support.s3 import StallingProxy

    with StallingProxy() as silent:
        res = dstore(
            "train",
            "s3://bk/c.h5",
            "--epochs",
            1,
            "--run-dir",
            tmp_path / "run",
            env={**STALL_ENV, "AWS_ENDPOINT_URL": silent.url},
        )
    one_line_error(res, "s3://bk/c.h5", "ReadTimeoutError", WAIT_LINE)


@pytest.mark.mpi
def test_a_two_rank_own_script_reading_a_tiered_container_from_s3_ends_when_the_endpoint_stalls(tmp_path):
    import fsspec
    from store_scenarios import scenarios
    from support import s3 as s3_server
    from support.mpirun import run_mpi

    port = s3_server.free_port()
    server = s3_server.moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        env = {**STALL_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        local = scenarios.make_container(str(tmp_path / "c.h5"), n=300, seed=1, large=8000, small=8000)
        fs = fsspec.filesystem(
            "s3", skip_instance_cache=True, endpoint_url=env["AWS_ENDPOINT_URL"], key="testing", secret="testing"
        )
        fs.mkdir("stall")
        fs.put(local, "stall/c.h5")
        marker = tmp_path / "stall-now"
        with StallingProxyAt(env["AWS_ENDPOINT_URL"], str(marker)) as proxy:
            res = run_mpi(
                2,
                ["python", SCRIPT, "stall", "s3://stall/c.h5", str(marker)],
                timeout=BOUND_S,
                check=False,
                env={**env, "AWS_ENDPOINT_URL": proxy.url},
            )
        assert proxy.stalled.is_set() and res.returncode != 0 and "not reached" not in res.stdout, res
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dstore: error")]
        assert len(lines) == 1 and "s3://stall/c.h5" in lines[0] and WAIT_LINE in lines[0], res.stderr
    finally:
        server.stop()


def StallingProxyAt(upstream: str, marker: str):
    from support.s3 import StallingProxy

    return StallingProxy(upstream, marker)
