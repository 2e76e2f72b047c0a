"""An emulated cluster on one Linux machine (`dstore cluster`): one network namespace, hostname and
/dev/shm per node, joined by veth links to a bridge, started with MPICH's own launcher; for trying a
job's multi-node behaviour before a queue wait.

    c = cluster.up(nodes=2, ranks_per_node=2, link="1gbit")   # as root
    cluster.run(c, ["dstore", "train"])                        # mpiexec over node1:2,node2:2
    cluster.down(c.name)                                       # everything it made, also after a crash

How it is built (NOTE [ Emulated nodes ]):
- node i is the network namespace `NAME-nodei` with address A.B.C.i on its `eth0`, the far end of a veth
  pair whose near end `NAMEni` is a port of the bridge `NAMEbr` (A.B.C.254) in the root namespace;
- MPICH's hydra starts one proxy per node through `launch.sh` (written beside the state record) as it
  would through ssh: `ip netns exec NAME-nodei unshare --uts --mount`, then `hostname nodei`, an
  /etc/hosts naming every node, and a fresh tmpfs on /dev/shm (with `node_tmp`, on /tmp too); the rest
  of the file system is shared, as a cluster's parallel file system is. Hydra groups ranks by proxy,
  so `MPI_COMM_TYPE_SHARED` splits by emulated node and MPICH's shared memory (its /dev/shm
  segments) stays inside one;
- between nodes, UCX would find that every "node" is the same machine and move the bytes through
  shared memory or cross-memory attach, never touching the links (measured: 100 MB of Sendrecv between
  two nodes put 21 kB on the veth). `run` therefore sets UCX_TLS=tcp,self and UCX_NET_DEVICES=eth0
  (OFI: FI_PROVIDER=tcp, FI_TCP_IFACE=eth0), so every byte between nodes crosses the node's link;
  loopback is never used between nodes (each namespace has its own);
- a link is shaped with a token bucket (`tc ... tbf`) on both ends of its veth (this kernel has no netem,
  so no added latency); `set_link` takes a node's link down and up, `signal_node` signals its processes.
- NOTE [ A node lost ]: when every process of a node dies, its proxy included, hydra ends the job at once
  and says only that a control connection closed. The launcher therefore runs the proxy as its child
  and appends `start HOST` and `end HOST STATUS` to the run's $DSTORE_CLUSTER_EVENTS; after a failed
  run, `lost_nodes` names each node whose proxy was killed by a signal (hydra's own cleanup ends a
  proxy with a status), with its ranks and what is left of it;
- the state record (/run/dstore-cluster/NAME/state.json) lists what `up` made; `down` removes it and
  also sweeps every namespace and link whose name follows NAME's pattern, so a crashed `up` or a
  killed `run` leaves nothing that `down` does not find.
"""

from __future__ import annotations

import dataclasses
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dstore.errors import ConfigError, DStoreError
from dstore.runtime import rc
from dstore.runtime.watchdog import span

STATE_ROOT = Path("/run/dstore-cluster")
"""One folder per cluster (its state record, launcher script and the pids of its runs), and the lock
that serialises `up` and `down` on this machine."""

DEFAULT_NAME = "dstore"
DEFAULT_SUBNET = "10.99.0.0/24"
MAX_NAME = 10
"""Longest cluster name: a link is named NAME + "n" + node + "p", and Linux allows 15 characters."""
MAX_NODES = 250

LINKS = {"none": None, "1gbit": ("1gbit", "256kb"), "10gbit": ("10gbit", "2560kb")}
"""`--link` choices: the token bucket's rate and burst (a burst of about 2 ms at the rate: smaller ones
cannot reach the rate at the kernel's timer granularity)."""
TBF_LATENCY = "10ms"

MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}
"""Set for every `run` (NOTE [ Emulated nodes ]): bytes between nodes go through the links, not memory."""

DROPPED_ENV = ("DSTORE_RANKS_PER_NODE",)
"""Removed from a run's environment: the emulated nodes are real to MPI, and this one would cut them again."""


class ClusterError(DStoreError, RuntimeError):
    """An emulated cluster cannot be made, found, run on or removed; the message says which and why."""


class ClusterUnavailable(ClusterError):
    """This machine cannot host an emulated cluster (not root, no `ip netns`, no `unshare`)."""


def unavailable() -> str | None:
    """Why this machine cannot host an emulated cluster, or None where it can."""
    if sys.platform != "linux":
        return f"dstore cluster needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            "dstore cluster needs root (it adds network namespaces, links and mounts): run it as root, "
            "or in a container with CAP_SYS_ADMIN and CAP_NET_ADMIN"
        )
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("mount", "util-linux")):
        if shutil.which(tool) is None:
            return f"dstore cluster needs `{tool}` ({package}), which is not on PATH"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {_last_line(probe.stderr)}"
    return None


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else "(no message)"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """One emulated cluster: its name (the prefix of everything it made), subnet, node count, ranks
    per node (the default layout of `run`), link speed, and whether each node has its own /tmp."""

    name: str
    subnet: str
    nodes: int
    ranks_per_node: int = 1
    link: str = "none"
    node_tmp: bool = False
    shared_in_tmp: tuple[str, ...] = ()
    """With `node_tmp`: the folders directly under /tmp that every node still sees (where the software
    and the working folder that started the cluster live, as a cluster installs them on shared storage)."""

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def bridge(self) -> str:
        return f"{self.name}br"

    @property
    def host_address(self) -> str:
        """The bridge's address: where mpiexec listens for the nodes' proxies."""
        return str(self.network[254])

    def hostname(self, node: int) -> str:
        """Node `node`'s host name (1-based), as its processes and MPI see it."""
        return f"node{node}"

    def namespace(self, node: int) -> str:
        return f"{self.name}-node{node}"

    def veth(self, node: int) -> str:
        """The near (root namespace, bridge) end of node `node`'s link; its far end is `eth0` in the node."""
        return f"{self.name}n{node}"

    def address(self, node: int) -> str:
        return str(self.network[node])

    @property
    def folder(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def launcher(self) -> Path:
        return self.folder / "launch.sh"

    def hosts(self) -> str:
        """Hydra's `-hosts` for the default layout: node1:R,node2:R,..."""
        return ",".join(f"{self.hostname(i)}:{self.ranks_per_node}" for i in range(1, self.nodes + 1))


def check_name(name: str) -> str:
    """`name` if it can prefix a cluster's namespaces and links, else ConfigError."""
    if not re.fullmatch(rf"[a-z][a-z0-9]{{0,{MAX_NAME - 1}}}", name or ""):
        raise ConfigError(
            f"--name {name!r}: a cluster's name is 1 to {MAX_NAME} lower-case letters and digits, "
            "starting with a letter (it prefixes the names of its namespaces and links)"
        )
    return name


def check_subnet(subnet: str) -> str:
    """`subnet` as A.B.C.0/24 if it is a private IPv4 /24, else ConfigError."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=False)
    except ValueError as exc:
        raise ConfigError(f"--subnet {subnet!r}: not an IPv4 network ({exc})") from None
    if net.prefixlen != 24 or not net.is_private:
        raise ConfigError(
            f"--subnet {subnet!r}: give a private /24, such as {DEFAULT_SUBNET} (nodes get .1 upwards, the bridge .254)"
        )
    return str(net)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _cmd(["ip", *args], check=check)


def _cmd(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {_last_line(proc.stderr)}")
    return proc


class _Lock:
    """The machine-wide lock of `up` and `down` (so that two of them never pick one subnet or name)."""

    def __enter__(self):
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(STATE_ROOT / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self._fd)


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network with an address in the root namespace or in any network namespace."""
    nets = []
    spaces = [None] + [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    for ns in spaces:
        argv = ["ip", "-4", "-o", "addr", "show"] if ns is None else ["ip", "-n", ns, "-4", "-o", "addr", "show"]
        out = _cmd(argv, check=False).stdout
        nets += [ipaddress.IPv4Interface(m).network for m in re.findall(r"inet (\S+)", out)]
    return nets


def free_subnet(first: int = 10, last: int = 250, base: str = "10.99") -> str:
    """The first /24 `base.K.0` (first <= K <= last) that no interface of this machine uses."""
    used = _subnets_in_use()
    for k in range(first, last + 1):
        net = ipaddress.IPv4Network(f"{base}.{k}.0/24")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise ClusterError(f"no free /24 in {base}.{first}.0 - {base}.{last}.0")


def software_in_tmp() -> tuple[str, ...]:
    """The folders directly under /tmp holding this Python's prefix, the installed dstore or the working
    folder: a node with a /tmp of its own must still see them (a clone under /tmp, as CI may make)."""
    import dstore

    names = set()
    for p in (sys.prefix, sys.executable, os.getcwd(), dstore.__file__):
        parts = Path(os.path.abspath(p)).parts
        if len(parts) > 2 and parts[:2] == ("/", "tmp"):
            names.add(parts[2])
    return tuple(sorted(names))


_LAUNCH = """#!/bin/sh
# Written by `dstore cluster up` for cluster {name}. MPICH's hydra starts a node's proxy as
# `THIS [-x] HOST COMMAND...`, as it would call ssh: run COMMAND in HOST's network namespace with
# HOST as its host name, its own /dev/shm{tmp_doc} and an /etc/hosts that names every node; the rest
# of the file system is shared.
# The proxy runs as this script's child, not in its place: when it ends, the script appends
# "HOST STATUS" to $DSTORE_CLUSTER_EVENTS (set by `cluster.run`), so that a node whose every process
# was killed, proxy included, can be named after hydra has ended the job (NOTE [ A node lost ]).
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
events=${{DSTORE_CLUSTER_EVENTS:-/dev/null}}
echo "start $host" >> "$events"
ip netns exec "{name}-$host" unshare --uts --mount --propagation private sh -c \\
    'hostname "$1" && mount --bind "$2" /etc/hosts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm{tmp_mount} \\
     && exec sh -c "$3"' sh "$host" "{hosts}" "$*"
code=$?
echo "end $host $code" >> "$events"
exit $code
"""


def _launch_script(c: Cluster) -> str:
    tmp_mount = ""
    if c.node_tmp:  # the host's /tmp kept aside first, to bind back what every node must see (shared_in_tmp)
        host_tmp = c.folder / "host-tmp"
        tmp_mount = f" && mount --bind /tmp {host_tmp} && mount -t tmpfs -o mode=1777 tmpfs /tmp"
        for d in c.shared_in_tmp:
            tmp_mount += f" && mkdir -p /tmp/{d} && mount --bind {host_tmp}/{d} /tmp/{d}"
    return _LAUNCH.format(
        name=c.name, tmp_doc=" and /tmp" if c.node_tmp else "", tmp_mount=tmp_mount, hosts=c.folder / "hosts"
    )


def _hosts_file(c: Cluster) -> str:
    """The nodes' /etc/hosts: each node's name at its address (a cluster's nodes resolve each other's names;
    gloo and torch's rendezvous look them up)."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{c.address(i)} {c.hostname(i)}" for i in range(1, c.nodes + 1)]
    # and at its IPv4-mapped IPv6 address: what a dual-stack server (torch's TCPStore) sees a client as and
    # looks up (else a warning per rank, after a lookup in DNS that no node can reach)
    lines += [f"::ffff:{c.address(i)} {c.hostname(i)}" for i in range(1, c.nodes + 1)]
    return "\n".join(lines) + "\n"


def _save(c: Cluster) -> None:
    c.folder.mkdir(parents=True, exist_ok=True)
    tmp = c.folder / "state.json.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(c), indent=1) + "\n")
    tmp.rename(c.folder / "state.json")


def load(name: str = DEFAULT_NAME) -> Cluster:
    """The cluster `name` that `up` made (ClusterError if there is none)."""
    path = STATE_ROOT / check_name(name) / "state.json"
    try:
        fields = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(
            f"no emulated cluster named {name!r} is up (no {path}): start one with "
            f"`dstore cluster up --name {name} --nodes N`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"{path}: unreadable state record ({exc}); `dstore cluster down --name {name}` removes what is left"
        ) from None
    return Cluster(**fields)


def up(
    name: str = DEFAULT_NAME,
    subnet: str = DEFAULT_SUBNET,
    nodes: int = 2,
    ranks_per_node: int = 1,
    link: str = "none",
    node_tmp: bool = False,
) -> Cluster:
    """Brings up an emulated cluster of `nodes` nodes (see NOTE [ Emulated nodes ]); returns it.

    Raises:
        ClusterUnavailable: this machine cannot host one (the reason).
        ConfigError: a bad name, subnet, node count or link; or the name or subnet is taken.
        ClusterError: a step failed (what was made is removed again).
    """
    reason = unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    c = Cluster(
        check_name(name),
        check_subnet(subnet),
        nodes,
        ranks_per_node,
        link,
        node_tmp,
        software_in_tmp() if node_tmp else (),
    )
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes {nodes}: give 1 to {MAX_NODES}")
    if ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node {ranks_per_node}: give 1 or more")
    if link not in LINKS:
        raise ConfigError(f"--link {link!r}: one of {', '.join(LINKS)}")
    if LINKS[link] and shutil.which("tc") is None:
        raise ClusterUnavailable(f"--link {link} needs `tc` (iproute2), which is not on PATH")
    with _Lock():
        if (c.folder / "state.json").exists() or any(_leftovers(c.name)):
            raise ConfigError(
                f"--name {name}: a cluster of that name is up (or was left by a crash): "
                f"`dstore cluster down --name {name}` first, or pick another name"
            )
        taken = [u for u in _subnets_in_use() if u.overlaps(c.network)]
        if taken:
            raise ConfigError(
                f"--subnet {c.subnet}: already used on this machine ({taken[0]}): pick another, "
                f"e.g. --subnet {free_subnet()}"
            )
        _save(c)  # first: a crash from here on leaves a record for `down`
        try:
            _make(c)
        except BaseException:
            _remove(c.name)
            raise
    return c


def _make(c: Cluster) -> None:
    (c.folder / "hosts").write_text(_hosts_file(c))
    (c.folder / "host-tmp").mkdir(exist_ok=True)
    c.launcher.write_text(_launch_script(c))
    c.launcher.chmod(0o755)
    _ip("link", "add", c.bridge, "type", "bridge")
    _ip("addr", "add", f"{c.host_address}/24", "dev", c.bridge)
    _ip("link", "set", c.bridge, "up")
    for i in range(1, c.nodes + 1):
        ns, near, far = c.namespace(i), c.veth(i), c.veth(i) + "p"
        _ip("netns", "add", ns)
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("link", "set", far, "netns", ns)
        _ip("link", "set", near, "master", c.bridge, "up")
        _ip("-n", ns, "link", "set", far, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{c.address(i)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        shape(c, i, c.link)


def shape(c: Cluster, node: int, link: str) -> None:
    """Sets node `node`'s link speed (a LINKS name, or a tc rate such as `100mbit`) in both directions."""
    if link in LINKS:
        spec = LINKS[link]
    elif re.fullmatch(r"\d+(\.\d+)?[kmg]?bit", link):
        spec = (link, "256kb")
    else:
        raise ConfigError(f"link {link!r}: one of {', '.join(LINKS)}, or a tc rate such as 100mbit")
    for prefix, dev in ((["ip", "netns", "exec", c.namespace(node)], "eth0"), ([], c.veth(node))):
        _cmd(prefix + ["tc", "qdisc", "del", "dev", dev, "root"], check=False)  # none yet: fine
        if spec:
            rate, burst = spec
            _cmd(
                prefix
                + [
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    TBF_LATENCY,
                ]
            )


def set_link(c: Cluster, node: int, state: str) -> None:
    """Takes node `node`'s link `down` or brings it `up` (at the bridge end: the node sees its carrier go)."""
    if state not in ("up", "down"):
        raise ConfigError(f"link state {state!r}: up or down")
    _ip("link", "set", c.veth(node), state)


def node_pids(c: Cluster, node: int) -> list[int]:
    """The processes running in node `node` (its proxy and ranks)."""
    out = _ip("netns", "pids", c.namespace(node), check=False).stdout
    return [int(x) for x in out.split()]


def signal_node(c: Cluster, node: int, sig: int = signal.SIGKILL) -> list[int]:
    """Sends `sig` to every process of node `node`; returns their pids."""
    pids = node_pids(c, node)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def hosts_for(c: Cluster, hosts: str | None) -> str:
    """Hydra's `-hosts` list: `hosts` (node1:3,node2:1; a bare node name means 1 rank) checked against
    the cluster's nodes, or the cluster's default layout."""
    if not hosts:
        return c.hosts()
    names = {c.hostname(i) for i in range(1, c.nodes + 1)}
    out = []
    for part in hosts.split(","):
        host, _, count = part.strip().partition(":")
        if host not in names:
            raise ConfigError(
                f"--hosts {hosts!r}: {host!r} is not a node of cluster {c.name} "
                f"({c.hostname(1)} to {c.hostname(c.nodes)})"
            )
        if count and not (count.isdigit() and int(count) >= 1):
            raise ConfigError(f"--hosts {hosts!r}: {part.strip()!r} needs a rank count >= 1 after the colon")
        out.append(f"{host}:{count or 1}")
    return ",".join(out)


def mpiexec_command(
    c: Cluster, command: list[str], hosts: str | None = None, n: int | None = None, mpiexec: str | None = None
) -> list[str]:
    """The `mpiexec` command line that runs `command` over cluster `c` (n ranks: the hosts' total by default)."""
    if not command:
        raise ConfigError("dstore cluster run: give the command after `--`, e.g. `dstore cluster run -- dstore train`")
    layout = hosts_for(c, hosts)
    total = sum(int(p.split(":")[1]) for p in layout.split(","))
    if n is not None and n < 1:
        raise ConfigError(f"-n {n}: give 1 or more ranks")
    exe = mpiexec or _mpiexec()
    return [
        exe,
        "-launcher",
        "ssh",
        "-launcher-exec",
        str(c.launcher),
        "-hosts",
        layout,
        "-localhost",
        c.host_address,
        "-n",
        str(n or total),
        *command,
    ]


def _mpiexec() -> str:
    """MPICH's mpiexec beside this Python (the registry's MPICH), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise ClusterUnavailable("no mpiexec beside this Python or on PATH (dstore cluster runs MPICH's hydra)")
    return found


def run_env(base: dict | None = None) -> dict:
    """The environment of a run: `base` (os.environ) with MPI_ENV set and DROPPED_ENV removed."""
    env = dict(os.environ if base is None else base)
    for key in DROPPED_ENV:
        env.pop(key, None)
    env.update(MPI_ENV)
    return env


def run(
    c: Cluster,
    command: list[str],
    hosts: str | None = None,
    n: int | None = None,
    env: dict | None = None,
    timeout: float | None = None,
    mpiexec: str | None = None,
    **popen,
) -> subprocess.CompletedProcess:
    """Runs `command` as an mpiexec job over cluster `c` (see `mpiexec_command`) and waits for it.

    SIGINT and SIGTERM sent to this process are passed on to mpiexec (which passes them to every
    rank); after `timeout` seconds the job is killed (returncode -9). `mpiexec`: MPICH's, by default the
    one beside this Python. `popen` goes to subprocess.Popen
    (stdout=PIPE to capture); the run's pid is kept in the cluster's folder while it runs, so that
    `down` ends it even if this process dies.
    """
    argv = mpiexec_command(c, command, hosts, n, mpiexec)
    events = c.folder / "events" / f"{os.getpid()}-{time.monotonic_ns()}"
    events.parent.mkdir(parents=True, exist_ok=True)
    events.touch()
    proc = subprocess.Popen(argv, env={**run_env(env), EVENTS_ENV: str(events)}, start_new_session=True, **popen)
    runs = c.folder / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    record = runs / str(proc.pid)
    record.write_text(" ".join(argv) + "\n")
    forward = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    main_thread = _is_main_thread()
    if main_thread:
        for s in forward:
            signal.signal(s, lambda sig, _frame: proc.send_signal(sig))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        proc.returncode = -signal.SIGKILL
    finally:
        if main_thread:
            for s, h in forward.items():
                signal.signal(s, h)
        record.unlink(missing_ok=True)
    lost = lost_nodes(c, events, hosts_for(c, hosts), n) if proc.returncode != 0 else []
    events.unlink(missing_ok=True)
    for line in lost:
        if isinstance(err, str):
            err += line + "\n"
        elif isinstance(err, bytes):
            err += line.encode() + b"\n"
        else:
            print(line, file=sys.stderr, flush=True)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


EVENTS_ENV = rc.CLUSTER_EVENTS.name
"""The file a run's launchers append `start HOST` and `end HOST STATUS` to (NOTE [ A node lost ])."""

LAUNCHERS_WAIT = 3.0
"""Seconds a failed run waits for its launchers' last records (they end as soon as their proxy has)."""


def lost_nodes(c: Cluster, events: Path, layout: str, n: int | None = None) -> list[str]:
    """One line per node whose proxy was killed by a signal during a failed run (NOTE [ A node lost ]).

    Hydra ends the whole job at once when a node's proxy vanishes, and says only that a control
    connection closed; the launcher that started the proxy saw how it ended, and this names the node,
    its ranks and what is left of it."""
    deadline = time.monotonic() + LAUNCHERS_WAIT
    while True:
        records = [line.split() for line in events.read_text().splitlines()]
        started = [r[1] for r in records if r[:1] == ["start"] and len(r) == 2]
        ended = {r[1]: int(r[2]) for r in records if r[:1] == ["end"] and len(r) == 3 and r[2].isdigit()}
        if set(started) <= set(ended) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    ranks = ranks_by_host(layout, n)
    nodes = {c.hostname(i): i for i in range(1, c.nodes + 1)}
    lines = []
    for host, code in ended.items():
        if code <= 128 or code - 128 not in signal.valid_signals():
            continue  # ended by itself (hydra's cleanup ends a proxy with a status, not a signal)
        left = node_pids(c, nodes[host])
        lines.append(
            f"dstore cluster: node {host} (ranks {span(ranks.get(host, [])) or 'none'}) lost: its MPI proxy was killed by "
            f"{signal.Signals(code - 128).name}, "
            + (f"{len(left)} of its processes still running" if left else "no process of the node left")
            + "; MPICH ended the job"
        )
    return lines


def ranks_by_host(layout: str, n: int | None) -> dict[str, list[int]]:
    """Which ranks hydra puts on which host of `layout` (node1:2,node2:2): blocks in order, wrapping
    round when n exceeds the hosts' total."""
    slots = [host for host, _, k in (p.partition(":") for p in layout.split(",")) for _ in range(int(k))]
    out: dict[str, list[int]] = {}
    for rank in range(n or len(slots)):
        out.setdefault(slots[rank % len(slots)], []).append(rank)
    return out


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def status(name: str = DEFAULT_NAME) -> dict:
    """What cluster `name` is: its record, and per node its namespace, address, link state and processes."""
    c = load(name)
    nodes = []
    for i in range(1, c.nodes + 1):
        link = _ip("-o", "link", "show", c.veth(i), check=False).stdout
        state = "missing" if not link else ("up" if re.search(r"[<,]UP[,>]", link) else "down")
        qdisc = _cmd(["tc", "qdisc", "show", "dev", c.veth(i)], check=False).stdout if shutil.which("tc") else ""
        rate = re.search(r"rate (\S+)", qdisc)
        nodes.append(
            {
                "node": c.hostname(i),
                "namespace": c.namespace(i),
                "address": c.address(i),
                "link": state,
                "rate": rate.group(1) if rate else "unshaped",
                "pids": node_pids(c, i),
            }
        )
    runs = sorted(int(p.name) for p in (c.folder / "runs").glob("*")) if (c.folder / "runs").exists() else []
    return {
        **dataclasses.asdict(c),
        "bridge": c.bridge,
        "host_address": c.host_address,
        "node_list": nodes,
        "runs": [r for r in runs if _alive(r)],
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(name: str) -> tuple[list[str], list[str]]:
    """(namespaces, links) on this machine whose names follow cluster `name`'s pattern."""
    nss = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    nss = [ns for ns in nss if re.fullmatch(rf"{name}-node\d+", ns)]
    links = re.findall(r"^\d+: ([^:@\s]+)", _ip("-o", "link", "show").stdout, re.M)
    links = [x for x in links if re.fullmatch(rf"{name}(br|n\d+p?)", x)]
    return nss, links


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Removes cluster `name`: ends its runs and every process in its nodes, deletes its namespaces (their
    mounts go with their last process), links, bridge and folder. Works from the state record and, for
    what a crash left unrecorded, by name pattern. Returns what it removed (empty: nothing was there)."""
    check_name(name)
    reason = unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    with _Lock():
        return _remove(name)


def _remove(name: str) -> list[str]:
    removed = []
    folder = STATE_ROOT / name
    for record in sorted((folder / "runs").glob("*")) if (folder / "runs").exists() else []:
        pid = int(record.name)
        if _alive(pid) and "mpiexec" in _cmdline(pid):
            _kill_group(pid)
            removed.append(f"run {pid}")
    nss, links = _leftovers(name)
    for ns in nss:
        pids = [int(x) for x in _ip("netns", "pids", ns, check=False).stdout.split()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if _wait_gone(pids, 2.0):
                break
        if pids:
            removed.append(f"{len(pids)} process(es) in {ns}")
    # Links first (a veth's far end goes with it), then namespaces: the kernel frees a deleted namespace
    # later, in the background, and a link still inside it would outlive this call for a while.
    for link in sorted(links, key=lambda x: x.endswith("br")):  # the bridge last
        if _ip("link", "del", link, check=False).returncode == 0:
            removed.append(f"link {link}")
    for ns in nss:
        _ip("netns", "del", ns, check=False)
        removed.append(f"namespace {ns}")
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(f"folder {folder}")
    left = _leftovers(name)
    if left[0] or left[1]:
        raise ClusterError(f"dstore cluster down --name {name}: could not remove {', '.join(left[0] + left[1])}")
    return removed


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
        if not _wait_gone([pid], 2.0):
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int], seconds: float) -> bool:
    """True once none of `pids` is alive (reaped or not: a zombie counts as gone), within `seconds`."""
    end = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if _alive(p) and not _zombie(p)]
        if not alive:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def clusters() -> list[str]:
    """The names of the clusters with a state record on this machine."""
    return sorted(p.parent.name for p in STATE_ROOT.glob("*/state.json")) if STATE_ROOT.exists() else []
