"""Every documented resume line runs as written (issue 32): each `dstore train ... --resume` command of
docs/training.md, docs/guide.md (its Slurm script too) and README.md, after the run it continues
(the command before it in the same block with the same --run-dir, or, for a script that is its own
requeue, the same line), stopped after one step as a crash or a preemption would stop it. Paths of
containers become small test containers, `mpiexec -n N` one process, `--device cuda` the CPU
where there is no GPU, and an ImageNet-sized model (`--model resnet50`) `small_cnn`, whose 90
epochs of a 48-sample container take seconds on a CPU (ResNet-50's would take hours); nothing else is
added to the resume line."""

import re
import shlex

import pytest
import torch
from support.formats import raw_container
from support.mpirun import REPO

from dstore.tools.cli import main

DOCS = ("docs/training.md", "docs/guide.md", "README.md")
BIG_MODELS = ("resnet18", "resnet50")  # run as small_cnn here (the module docstring says why)


def _commands(block: str) -> list[list[str]]:
    """The argv (after `dstore`) of each `dstore train` command in a bash block."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#") or "dstore train" not in line:
            continue
        line = line.split("||")[0].split(" #")[0]
        words = shlex.split(line.replace("$RUN_DIR", "RUNDIR").replace("$HOME", "HOME"))
        found.append(words[words.index("dstore") + 1 :])
    return found


def _flag(argv: list[str], name: str):
    return argv[argv.index(name) + 1] if name in argv else None


def documented_resumes() -> list[tuple[str, list[str], list[str]]]:
    """(where, the first run's argv, the resume's argv) of every documented resume line."""
    pairs = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", (REPO / doc).read_text(), re.S):
            commands = _commands(block)
            for k, argv in enumerate(commands):
                if "--resume" not in argv:
                    continue
                first = [
                    c for c in commands[:k] if "--resume" not in c and _flag(c, "--run-dir") == _flag(argv, "--run-dir")
                ]
                pairs.append((f"{doc}: {' '.join(argv)}", first[-1] if first else argv, argv))
    return pairs


PAIRS = documented_resumes()


def test_the_docs_hold_the_resume_lines_this_test_runs():
    where = " ".join(w for w, _, _ in PAIRS)
    assert len(PAIRS) >= 3 and "docs/training.md" in where and "docs/guide.md" in where and "srun" not in where
    assert any(first is resume for _, first, resume in PAIRS)  # the Slurm script: its own requeue


def _local(argv: list[str], tmp_path) -> list[str]:
    """`argv` with its containers made (small, in tmp_path) and cuda on the CPU where there is none."""
    out = []
    for word in argv:
        if word.endswith(".h5"):
            path = tmp_path / word.lstrip("/").replace("/", "_")
            if not path.exists():
                raw_container(
                    path, n=48 if "val" not in word else 24, shape=(6, 6, 1), classes=3, seed=1 if "val" in word else 0
                )
            word = str(path)
        out.append(word)
    if "cuda" in out and not torch.cuda.is_available():
        out[out.index("cuda")] = "cpu"
    if "--model" in out and out[out.index("--model") + 1] in BIG_MODELS:
        out[out.index("--model") + 1] = "small_cnn"
    return out


@pytest.mark.parametrize(
    "where, first, resume", PAIRS, ids=[w.split(":")[0] + f"-{k}" for k, (w, _, _) in enumerate(PAIRS)]
)
def test_a_documented_resume_line_runs_as_written(where, first, resume, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative run dirs (runs/r1) land here
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(_local(first, tmp_path) + ["--stop-after-steps", "1", "--no-progress"]) == 0, capsys.readouterr()
    capsys.readouterr()
    code = main(_local(resume, tmp_path))
    out = capsys.readouterr()
    assert code == 0, (where, out.err[-2000:])
    assert "resumed from" in out.out and "test accuracy" in out.out, (where, out.out[-2000:])
