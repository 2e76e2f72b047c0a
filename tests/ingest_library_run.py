"""Run under mpiexec by test_ingest_mpi: calls the library `ingest` (not the CLI, so nothing aborts
the job) once per scenario and writes, per rank, one JSON line per scenario with what it returned or
raised to RESULTS_DIR/rank<r>.jsonl (files, not stdout, where the ranks' lines could interleave)."""

import json
import os
import sys

from mpi4py import MPI

from dstore.ingest import ingest


def main(results_dir, specs):
    comm = MPI.COMM_WORLD
    lines = []
    for spec in specs:
        kw = json.loads(spec)
        source, output = kw.pop("source"), kw.pop("output")
        try:
            report = ingest(source, output, comm=comm, progress=False, **kw)
            result = {"ok": True, "samples": report.samples}
        except Exception as exc:  # noqa: BLE001 - what each rank raised is the point
            result = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
        result["rank"] = comm.Get_rank()
        lines.append(json.dumps(result) + "\n")
        comm.Barrier()  # every rank got here: nobody is left waiting inside ingest
    with open(os.path.join(results_dir, f"rank{comm.Get_rank()}.jsonl"), "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
