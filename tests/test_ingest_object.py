"""Ingest from object storage (`s3://bucket/prefix`) against a real S3 server (moto's server mode on a
free local port, dummy credentials through the environment): the container holds what a local
ingest of the same files holds (bytes, labels, names, order), and a store failure is one line naming
the URL."""

from __future__ import annotations

import io
import json
import re
import tarfile

import pytest
from support import s3 as s3_server
from support.ingest import ingest_here, png_bytes

from dstore.errors import SampleError
from dstore.formats import open_container
from dstore.ingest.registry import source_type_of

endpoint, s3 = s3_server.endpoint, s3_server.s3  # the test server's fixtures (used by name)
bucket = s3_server.bucket
_free_port = s3_server.free_port


def shard_bytes(first: int, n: int, extra: bool = False) -> bytes:
    """A WebDataset shard of n samples (tiny PNGs seeded first.., labels seed % 3)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for k in range(first, first + n):
            members = [("png", png_bytes(4, k)), ("cls", str(k % 3).encode())]
            if extra:
                members.append(("json", json.dumps({"k": k}).encode()))
            for ext, data in members:
                info = tarfile.TarInfo(f"s{k:05d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def contents(path):
    """[(name, bytes, label)] of a container in its order, its class names and encoding."""
    with open_container(str(path)) as c:
        return (
            [(c.name(j), bytes(c.sample(j)[0]), int(c.sample(j)[1])) for j in range(c.num_samples)],
            tuple(c.info.class_names),
            c.info.encoding,
        )


def put_tree(fs, prefix: str, local, files: dict[str, bytes]) -> None:
    """The same files under a local directory and an S3 prefix."""
    for rel, data in files.items():
        fs.pipe(f"{prefix}/{rel}", data)
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)


@pytest.mark.parametrize("form", ["prefix", "glob", "braces"])
def test_tar_shards_from_s3_match_a_local_ingest(s3, tmp_path, form):
    b = bucket(s3)
    files = {f"shards/train-{k:03d}.tar": shard_bytes(10 * k, 4 + k, extra=(k == 1)) for k in range(3)}
    put_tree(s3, f"{b}/data", tmp_path / "data", files)
    spec = {"prefix": "shards", "glob": "shards/train-*.tar", "braces": "shards/train-{000..002}.tar"}[form]
    local, remote = (
        ingest_here(tmp_path / "data" / spec, tmp_path / "local.h5"),
        ingest_here(f"s3://{b}/data/{spec}", tmp_path / "remote.h5"),
    )
    assert source_type_of(f"s3://{b}/data/{spec}") == "tar"
    got, expected = contents(tmp_path / "remote.h5"), contents(tmp_path / "local.h5")
    assert got == expected and len(got[0]) == 4 + 5 + 6
    assert remote.samples == local.samples == 15
    assert [n for n in remote.notes if "fields stored" in n] == [n for n in local.notes if "fields stored" in n] != []
    with open_container(str(tmp_path / "remote.h5")) as r, open_container(str(tmp_path / "local.h5")) as lo:
        assert r.field_names != () and r.fields_of(range(15)) == lo.fields_of(range(15))  # fields read by ranged GETs


def test_tar_prefix_with_two_splits_needs_split(s3, tmp_path):
    b = bucket(s3)
    files = {"train-000.tar": shard_bytes(0, 3), "validation-000.tar": shard_bytes(100, 2)}
    put_tree(s3, f"{b}/wds", tmp_path / "wds", files)
    with pytest.raises(SampleError, match=r"holds the splits train, validation; .*--split NAME"):
        ingest_here(f"s3://{b}/wds", tmp_path / "mixed.h5")
    ingest_here(f"s3://{b}/wds", tmp_path / "r.h5", split="validation")
    ingest_here(tmp_path / "wds", tmp_path / "l.h5", split="validation")
    assert contents(tmp_path / "r.h5") == contents(tmp_path / "l.h5")
    assert len(contents(tmp_path / "r.h5")[0]) == 2


def test_missing_bucket_prefix_and_shard_name_the_url(s3, tmp_path):
    b = bucket(s3)
    s3.pipe(f"{b}/wds/a-000.tar", shard_bytes(0, 2))
    cases = {
        "s3://no-such-bucket/wds": r"^s3://no-such-bucket/wds: cannot list: does not exist",
        f"s3://{b}/nothing-here": rf"^s3://{b}/nothing-here: no objects below this prefix",
        f"s3://{b}/wds/a-001.tar": rf"^s3://{b}/wds/a-001.tar: does not exist",
        "s3://no-such-bucket/wds/a.tar": r"^s3://no-such-bucket/wds/a.tar: does not exist",
        f"s3://{b}/wds/a-{{000..001}}.tar": rf"^s3://{b}/wds/a-{{000..001}}.tar: 1 of its 2 shards do not exist "
        rf"\(first: s3://{b}/wds/a-001.tar\)",
    }
    for url, pattern in cases.items():
        with pytest.raises(SampleError, match=pattern) as info:
            ingest_here(url, tmp_path / "x.h5", source_type="tar")
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x.h5").exists()


def test_truncated_shard_in_s3_names_the_url(s3, tmp_path):
    b = bucket(s3)
    whole = shard_bytes(0, 3)
    s3.pipe(f"{b}/cut/a.tar", whole[:1100])
    with pytest.raises(SampleError, match=rf"^s3://{b}/cut/a.tar: truncated"):
        ingest_here(f"s3://{b}/cut/a.tar", tmp_path / "x.h5")


def test_unreachable_endpoint_names_the_url(s3, tmp_path, monkeypatch):
    """An endpoint nothing listens on (a network failure): one line naming the URL, no traceback."""
    b = bucket(s3)
    s3.pipe(f"{b}/wds/a.tar", shard_bytes(0, 2))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    with pytest.raises(SampleError, match=rf"^s3://{b}/wds/a.tar: cannot read: .*(connect|Connect)") as info:
        ingest_here(f"s3://{b}/wds/a.tar", tmp_path / "x.h5")
    assert "\n" not in str(info.value)


def _tables():
    pa = pytest.importorskip("pyarrow", reason="pyarrow is optional (pip install 'dstore-mpi[parquet]')")
    import pyarrow.ipc  # noqa: F401 - loads pa.ipc, used below
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])

    def table(first: int, n: int):
        images = pa.array([{"bytes": png_bytes(4, k), "path": None} for k in range(first, first + n)], type=image)
        return pa.table(
            {
                "image": images,
                "label": pa.array([k % 3 for k in range(first, first + n)]),
                "text": pa.array([f"row {k}" for k in range(first, first + n)]),
            }
        )

    def parquet(t, row_group_size=2) -> bytes:
        out = io.BytesIO()
        pq.write_table(t, out, row_group_size=row_group_size)
        return out.getvalue()

    def arrow(t) -> bytes:
        out = io.BytesIO()
        with pa.ipc.new_stream(out, t.schema) as w:  # datasets writes the stream format
            w.write_table(t)
        return out.getvalue()

    return table, parquet, arrow


def test_hub_parquet_prefix_from_s3_matches_a_local_ingest(s3, tmp_path):
    table, parquet, _ = _tables()
    b = bucket(s3)
    info = json.dumps(
        {"features": {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog", "emu"], "_type": "ClassLabel"}}}
    ).encode()
    files = {
        "data/train-00000-of-00002.parquet": parquet(table(0, 5)),
        "data/train-00001-of-00002.parquet": parquet(table(5, 3)),
        "data/test-00000-of-00001.parquet": parquet(table(100, 2)),
        "dataset_info.json": info,
        ".cache/x.parquet": parquet(table(200, 1)),
    }
    put_tree(s3, f"{b}/hub", tmp_path / "hub", files)
    url = f"s3://{b}/hub"
    assert source_type_of(url) == "parquet"
    with pytest.raises(SampleError, match=rf"^{url}: holds the splits train, test; .*--split NAME"):
        ingest_here(url, tmp_path / "mixed.h5")
    for split, n in (("train", 8), ("test", 2)):
        remote = ingest_here(url, tmp_path / f"r-{split}.h5", split=split)
        local = ingest_here(tmp_path / "hub", tmp_path / f"l-{split}.h5", split=split)
        got = contents(tmp_path / f"r-{split}.h5")
        assert got == contents(tmp_path / f"l-{split}.h5") and len(got[0]) == n
        assert got[1] == ("cat", "dog", "emu")
        assert remote.notes == [n.replace(str(tmp_path / "hub"), url) for n in local.notes]
    one = f"{url}/data/test-00000-of-00001.parquet"
    ingest_here(one, tmp_path / "one.h5")
    assert [x[1:] for x in contents(tmp_path / "one.h5")[0]] == [x[1:] for x in contents(tmp_path / "l-test.h5")[0]]


def test_saved_dataset_dict_from_s3_matches_a_local_ingest(s3, tmp_path):
    table, _, arrow = _tables()
    b = bucket(s3)
    files = {"dataset_dict.json": json.dumps({"splits": ["train", "test"]}).encode()}
    for split, first, n in (("train", 0, 4), ("test", 50, 3)):
        files[f"{split}/data-00000-of-00001.arrow"] = arrow(table(first, n))
        files[f"{split}/state.json"] = json.dumps(
            {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": split}
        ).encode()
    put_tree(s3, f"{b}/saved", tmp_path / "saved", files)
    ingest_here(f"s3://{b}/saved", tmp_path / "r.h5", split="test")
    ingest_here(tmp_path / "saved", tmp_path / "l.h5", split="test")
    got = contents(tmp_path / "r.h5")
    assert got == contents(tmp_path / "l.h5") and len(got[0]) == 3
    with pytest.raises(SampleError, match=rf"^s3://{b}/saved/nope.parquet: cannot read: does not exist"):
        ingest_here(f"s3://{b}/saved/nope.parquet", tmp_path / "x.h5")


def test_image_folder_prefix_from_s3_matches_a_local_ingest(s3, tmp_path):
    b = bucket(s3)
    files = {
        f"{cls}/{sub}{k}.png": png_bytes(4, 10 * c + k)
        for c, cls in enumerate(["dog", "cat", "emu"])
        for sub in ("", "a/", "a-b/", "a/x/")
        for k in (2, 0, 1)
    }
    files.update({"cat/notes.txt": b"not an image", "README.md": b"top", "cat/a/x.gif": b"GIF89a"})
    put_tree(s3, f"{b}/imgs", tmp_path / "imgs", files)
    url = f"s3://{b}/imgs"
    assert source_type_of(url) == "folder"
    remote = ingest_here(url, tmp_path / "r.h5", keep_order=True)
    local = ingest_here(tmp_path / "imgs", tmp_path / "l.h5", keep_order=True)
    got = contents(tmp_path / "r.h5")
    assert got == contents(tmp_path / "l.h5") and len(got[0]) == 36 and got[1] == ("cat", "dog", "emu")
    assert [n[0] for n in got[0][:12:3]] == ["cat/0.png", "cat/a/0.png", "cat/a-b/0.png", "cat/a/x/0.png"]
    assert sorted(i.replace(url, "") for i in remote.ignored) == sorted(
        i.replace(str(tmp_path / "imgs"), "") for i in local.ignored
    )
    s3.pipe(f"{b}/imgs/fox/only.txt", b"x")
    with pytest.raises(SampleError, match=rf"^{url}/fox: empty class folder"):
        ingest_here(url, tmp_path / "e.h5")


@pytest.mark.mpi
def test_two_ranks_ingest_s3_shards_as_one_rank_ingests_the_local_ones(s3, tmp_path):
    """Rank 0 lists the prefix and broadcasts the source; each rank reads its samples through its own
    connection; the container is the one a 1-rank local ingest writes. A missing bucket ends both ranks
    with one line naming the URL."""
    from support.mpirun import run_mpi

    b = bucket(s3)
    files = {f"train-{k:03d}.tar": shard_bytes(10 * k, 5) for k in range(3)}
    put_tree(s3, f"{b}/wds", tmp_path / "wds", files)
    run_mpi(
        2, ["dstore", "ingest", f"s3://{b}/wds", str(tmp_path / "r"), "--shards", "2", "--no-progress"], timeout=120
    )
    ingest_here(tmp_path / "wds", tmp_path / "l", shards=2)
    assert contents(tmp_path / "r") == contents(tmp_path / "l") and len(contents(tmp_path / "r")[0]) == 15
    bad = run_mpi(
        2,
        ["dstore", "ingest", "s3://no-such-bucket/wds", str(tmp_path / "x.h5"), "--no-progress"],
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0 and not (tmp_path / "x.h5").exists()
    errors = [line for line in bad.stderr.splitlines() if line.startswith("dstore: error")]
    assert errors and all(
        re.match(
            r"dstore: error( on rank 0/2)?: SampleError: s3://no-such-bucket/wds: cannot list: "
            r"does not exist",
            line,
        )
        for line in errors
    ), bad.stderr


def test_permission_denied_names_the_url(s3, tmp_path, monkeypatch):
    """moto enforcing IAM (its INITIAL_NO_AUTH_ACTION_COUNT at 0): the test's dummy key is unknown -> 403."""
    import moto.settings

    b = bucket(s3)
    s3.pipe(f"{b}/wds/a.tar", shard_bytes(0, 2))
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    with pytest.raises(
        SampleError, match=rf"^s3://{b}/wds: cannot list: permission denied \(check AWS_ACCESS_KEY_ID"
    ) as info:
        ingest_here(f"s3://{b}/wds", tmp_path / "x.h5", source_type="tar")
    assert "\n" not in str(info.value)


def test_flat_prefix_with_a_labels_csv_matches_a_local_ingest(s3, tmp_path):
    b = bucket(s3)
    files = {f"val/{k:03d}.png": png_bytes(4, k) for k in range(6)}
    rows = "file,label\n" + "".join(
        f"{'./' if k == 2 else ''}{k:03d}.png,{['cat', 'dog'][k % 2]}\n" for k in (5, 2, 0, 3)
    )
    files["val.csv"] = rows.encode()
    put_tree(s3, f"{b}/in", tmp_path / "in", files)
    local = ingest_here(
        tmp_path / "in" / "val", tmp_path / "l.h5", labels=str(tmp_path / "in" / "val.csv"), keep_order=True
    )
    for labels in (str(tmp_path / "in" / "val.csv"), f"s3://{b}/in/val.csv"):
        remote = ingest_here(f"s3://{b}/in/val", tmp_path / "r.h5", labels=labels, keep_order=True, overwrite=True)
        got = contents(tmp_path / "r.h5")
        assert got == contents(tmp_path / "l.h5") and len(got[0]) == 4 and got[1] == ("cat", "dog")
        assert remote.samples == local.samples == 4
    (tmp_path / "bad.csv").write_text("004.png,cat\n../x/000.png,dog\n")
    with pytest.raises(SampleError, match=r"bad.csv: row 2 names '../x/000.png', outside the prefix"):
        ingest_here(f"s3://{b}/in/val", tmp_path / "x.h5", labels=str(tmp_path / "bad.csv"))
    (tmp_path / "gone.csv").write_text("004.png,cat\n009.png,dog\n")
    report = ingest_here(f"s3://{b}/in/val", tmp_path / "g.h5", labels=str(tmp_path / "gone.csv"), on_error="skip")
    assert report.samples == 1 and "does not exist" in str(report.skipped)


def test_a_protocol_without_its_package_says_what_to_install(tmp_path):
    import importlib.util

    from dstore.errors import ConfigError

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here: the message for a missing package cannot be seen")
    with pytest.raises(ConfigError, match=r"reading gs:// sources needs gcsfs: pip install gcsfs"):
        ingest_here("gs://bucket/wds/", tmp_path / "x.h5")


def test_prefetch_fetches_a_chunk_ahead_and_load_takes_it(s3, tmp_path, monkeypatch):
    """process_block's prefetch fetches the chunk's samples (concurrently); load then needs no request:
    with the store gone, the prefetched samples load and the others fail naming the shard."""
    import fsspec

    from dstore.ingest.tar import TarSource

    b = bucket(s3)
    s3.pipe(f"{b}/wds/a.tar", shard_bytes(0, 4))
    src = TarSource(f"s3://{b}/wds/a.tar")
    src.prefetch([0, 2])
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    fsspec.filesystem("s3").clear_instance_cache()
    assert src.remote is not None  # an s3:// source
    src.remote._fs = None
    assert [src.load(0), src.load(2)] == [png_bytes(4, 0), png_bytes(4, 2)]
    with pytest.raises(SampleError, match=rf"^s3://{b}/wds/a.tar: cannot read: "):
        src.load(1)


def test_the_s3_endpoint_variable_wins_over_the_general_one(s3, endpoint, tmp_path, monkeypatch):
    """AWS_ENDPOINT_URL_S3 (the guide's choice for an S3-compatible server) is honoured over AWS_ENDPOINT_URL."""
    import fsspec

    b = bucket(s3)
    s3.pipe(f"{b}/wds/a.tar", shard_bytes(0, 2))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    fsspec.filesystem("s3").clear_instance_cache()
    assert ingest_here(f"s3://{b}/wds/a.tar", tmp_path / "x.h5").samples == 2
