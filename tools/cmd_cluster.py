"""`dstore cluster up|run|status|down`: an emulated cluster on this machine (dstore.tools.cluster)."""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = (
    "an emulated cluster on this machine (root): one network namespace, hostname and /dev/shm per node, "
    "shaped links, MPICH's launcher; `up`, `run -- COMMAND`, `status`, `down` (see docs/guide.md)"
)


def add_arguments(p) -> None:
    from dstore.tools.cluster import DEFAULT_NAME, DEFAULT_SUBNET, LINKS

    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    name_help = f"the cluster's name, the prefix of its namespaces and links (default: {DEFAULT_NAME})"

    u = sub.add_parser("up", help="bring up the nodes and their links")
    u.add_argument("--name", default=DEFAULT_NAME, help=name_help)
    u.add_argument("--nodes", type=int, default=2, help="number of nodes (default: 2)")
    u.add_argument(
        "--ranks-per-node", type=int, default=2, help="ranks per node in `run`'s default layout (default: 2)"
    )
    u.add_argument(
        "--link",
        default="10gbit",
        choices=list(LINKS),
        help="each node's link speed, both ways (default: 10gbit; none: unshaped)",
    )
    u.add_argument(
        "--subnet",
        default=DEFAULT_SUBNET,
        help=f"the nodes' private /24: node i gets .i, the bridge .254 (default: {DEFAULT_SUBNET})",
    )
    u.add_argument(
        "--node-tmp",
        action="store_true",
        help="give each node its own /tmp too, as most clusters do (default: /tmp is shared)",
    )

    r = sub.add_parser("run", help="run COMMAND as an mpiexec job over the nodes")
    r.add_argument("--name", default=DEFAULT_NAME, help=name_help)
    r.add_argument(
        "--hosts",
        default=None,
        help="ranks per node, e.g. node1:3,node2:1 (default: every node, --ranks-per-node of `up`)",
    )
    r.add_argument("-n", type=int, default=None, help="number of ranks (default: the total of the hosts)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    s = sub.add_parser("status", help="show the nodes, their links and processes")
    s.add_argument("--name", default=DEFAULT_NAME, help=name_help)
    s.add_argument("--json", action="store_true", help="print it as JSON")

    d = sub.add_parser("down", help="remove everything `up` made (also after a crash)")
    d.add_argument("--name", default=DEFAULT_NAME, help=name_help)


def run(args) -> int:
    from dstore.tools import cluster

    if args.action == "up":
        c = cluster.up(args.name, args.subnet, args.nodes, args.ranks_per_node, args.link, args.node_tmp)
        print(
            f"cluster {c.name} up: {c.nodes} nodes ({c.hosts()}) on {c.subnet}, link {c.link}, "
            f"/tmp {'per node' if c.node_tmp else 'shared'}; run jobs with `dstore cluster run "
            f"{'' if c.name == cluster.DEFAULT_NAME else '--name ' + c.name + ' '}-- COMMAND`",
            flush=True,
        )
        return 0
    if args.action == "down":
        removed = cluster.down(args.name)
        print(f"cluster {args.name} down: removed " + ("; ".join(removed) if removed else "nothing (none was up)"))
        return 0
    if args.action == "status":
        st = cluster.status(args.name)
        if args.json:
            print(json.dumps(st, indent=1))
            return 0
        print(
            f"cluster {st['name']}: {st['nodes']} nodes on {st['subnet']} (bridge {st['bridge']} "
            f"{st['host_address']}), default layout {cluster.load(args.name).hosts()}, "
            f"/tmp {'per node' if st['node_tmp'] else 'shared'}"
        )
        for n in st["node_list"]:
            print(f"  {n['node']}  {n['address']:<12} link {n['link']}, {n['rate']}; {len(n['pids'])} process(es)")
        if st["runs"]:
            print(f"  runs in progress: {', '.join(map(str, st['runs']))}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    c = cluster.load(args.name)
    layout = cluster.hosts_for(c, args.hosts)
    dropped = [k for k in cluster.DROPPED_ENV if k in os.environ]
    if dropped:
        print(f"dstore cluster: {', '.join(dropped)} not passed on (the cluster's nodes are real)", file=sys.stderr)
    print(
        f"dstore cluster: {args.n or 'all'} rank(s) on {layout} of cluster {c.name} (link {c.link})",
        file=sys.stderr,
        flush=True,
    )
    code = cluster.run(c, command, layout, args.n).returncode
    return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
