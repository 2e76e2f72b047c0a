"""`dstore train --config FILE`: flags from YAML or JSON (a run's config.json too), the command line
over the file, `--print-config` printing what a run would use (valid input again), and a key or a
value that is not allowed refused naming the file and the key."""

import dataclasses
import json

import pytest

from dstore.tools.cli import main
from dstore.training.config import TrainConfig


def _printed(capsys, argv) -> dict:
    assert main(["train", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)["config"]


def test_yaml_values_under_the_command_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(
        "batch_size: 32\nepochs: 2\nlr: 0.01\nmemory-budget: 8GiB\nmean: [0.5]\nstd: [0.25]\n"
        "image_size: [16, 16]\nprogress: false\ndrop_last: true\nshuffle: local\n"
    )
    got = _printed(capsys, ["--config", str(path), "--epochs", "5", "--lr", "0.02"])
    assert got["batch_size"] == 32 and got["epochs"] == 5 and got["lr"] == 0.02  # the command line wins
    assert got["memory_budget"] == 8 * 2**30 and got["mean"] == [0.5] and got["image_size"] == [16, 16]
    assert got["progress"] is False and got["drop_last"] is True and got["shuffle"] == "local"


def test_a_runs_config_json_and_the_printed_config_are_valid_input(tmp_path, capsys):
    cfg = dataclasses.replace(
        TrainConfig(), epochs=3, batch_size=16, seed=7, mean=(0.1, 0.2, 0.3), run_dir="runs/old", resume="auto"
    )
    written = {"config": json.loads(json.dumps(dataclasses.asdict(cfg))), "model": "small_cnn", "ranks": 2}
    (tmp_path / "config.json").write_text(json.dumps(written))  # as Fit writes it
    got = _printed(capsys, ["--config", str(tmp_path / "config.json")])
    want = {k: v for k, v in written["config"].items() if k not in ("runs_root", "run_dir", "resume")}
    assert {k: got[k] for k in want} == want
    assert got["run_dir"] is None and got["resume"] is None  # that run's place, not its configuration
    (tmp_path / "printed.json").write_text(json.dumps({"config": got}))
    assert _printed(capsys, ["--config", str(tmp_path / "printed.json")]) == got


@pytest.mark.parametrize(
    "text, says",
    [
        ("epoch: 3\n", "'epoch' is not a flag of this command (did you mean epochs?)"),
        ("epochs: three\n", "epochs='three': not a valid int"),
        ("shuffle: random\n", "shuffle='random' is not one of"),
        ("memory_budget: 8 parsecs\n", "memory_budget='8 parsecs'"),
        ("drop_last: maybe\n", "drop_last='maybe' must be a boolean"),
        ("[1, 2]\n", "holds a list, not a mapping"),
        ("epochs: [3\n", "not valid YAML"),
    ],
)
def test_a_bad_key_or_value_names_the_file_and_the_key(tmp_path, capsys, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(path), "--print-config"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err and says in err, err


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "nope.json")])
    assert "nope.json: cannot read it" in capsys.readouterr().err
