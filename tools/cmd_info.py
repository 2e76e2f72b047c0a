"""`dstore info`: a container's counts, bytes, encoding, classes and sample-size distribution."""

from __future__ import annotations

HELP = "Summarise a container: samples, bytes, encoding, classes with counts, sample sizes."


def add_arguments(parser) -> None:
    parser.add_argument(
        "container", help="an .h5 file, a .zarr directory, or a sharded manifest (.json or its directory)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    import json

    from mpi4py import MPI

    # here, not at the top (as in every cmd module): it loads h5py and zarr, which `dstore --help` must not
    from dstore.runtime.collective import on_root
    from dstore.verify import container_info, format_info

    def show() -> int:
        summary = container_info(args.container)
        print(json.dumps(summary, indent=2) if args.json else format_info(summary), flush=True)
        return 0

    # Not collective work: under mpiexec rank 0 alone reads and prints (one copy per job, not one
    # per rank); its error is raised on every rank, so the job ends with it.
    return on_root(MPI.COMM_WORLD, show)
