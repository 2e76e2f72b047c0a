"""`dstore verify`: recompute every checksum (optionally decode every sample); non-zero exit on any bad sample."""

from __future__ import annotations

HELP = (
    "Check a container: recompute every sample's checksum, check labels against the class names, "
    "optionally decode every sample. Runs in parallel under mpiexec. Exits 1 naming every bad sample."
)


def add_arguments(parser) -> None:
    parser.add_argument(
        "container", help="an .h5 file, a .zarr directory, or a sharded manifest (.json or its directory)"
    )
    parser.add_argument("--decode", action="store_true", help="also decode every sample (slow)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of text")


def run(args) -> int:
    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads h5py and zarr, which `dstore --help` must not
    from dstore.verify import verify_container

    comm = MPI.COMM_WORLD
    report = verify_container(args.container, comm=comm, decode=args.decode)
    if comm.Get_rank() == 0:
        if args.json:
            import dataclasses
            import json

            print(json.dumps({**dataclasses.asdict(report), "ok": report.ok}, default=str), flush=True)
        else:
            print(report.summary(), flush=True)
    return 0 if report.ok else 1
