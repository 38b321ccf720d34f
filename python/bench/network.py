"""The simulated cluster's network: a bridge, and a network namespace per node.

Each worker node of :class:`cluster.Cluster` lives in a network namespace of
its own, with one interface (``eth0``) on a veth pair whose other end is a
port of a bridge on this machine. The bridge holds the subnet's first
address (the head, the driver and the services they relay); node ``i``
holds address ``i + 1``::

    driver, head, S3 relay ── 10.213.X.1 ─┬─ bridge ─┬─ eth0 10.213.X.2  worker-1
                                          │          └─ eth0 10.213.X.3  worker-2
                                          └─ ...

Nothing is routed beyond the subnet: no forwarding, so all traffic stays on
this machine. Each end of a node's veth pair may carry a token bucket
(``tc qdisc ... tbf``), which caps the bandwidth in each direction.

Latency is added by :mod:`relay`, not by ``netem``, which not every kernel
has: in front of a service of this machine (:meth:`cluster.Cluster.relay`),
and, with ``latency_ms``, in front of every node. There a firewall rule
(nft(8)) redirects each TCP connection that arrives on the node's link to
an inbound relay in the node's namespace, which forwards it to where it was
addressed, ``latency_ms`` later per round trip::

    worker-1 ── bridge ── eth0 of worker-2 ─► nft redirect ─► relay ─► service
                                              (any port)      (held)   (its port)

A connection between two nodes, or from the head to a node, then takes
``latency_ms`` longer per round trip; one from a node to the head takes the
head's relay's, if any. A node's connections to itself do not cross its
link and are not delayed.

Interfaces and namespaces are named after a short random tag (``dfx<tag>``),
so two networks never collide and a state file can remove one a killed
process left (:func:`remove_recorded`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
from typing import Any

IP = shutil.which("ip") or "/usr/sbin/ip"
"""iproute2's ip(8)."""

TC = shutil.which("tc") or "/usr/sbin/tc"
"""iproute2's tc(8)."""

NSENTER = shutil.which("nsenter") or "nsenter"
"""util-linux's nsenter(1): runs a node's command in its network namespace."""

NFT = shutil.which("nft") or "/usr/sbin/nft"
"""nftables' nft(8): redirects a node's inbound connections to its relay."""

RELAY = pathlib.Path(__file__).resolve().with_name("relay.py")
"""The relay that holds a node's inbound traffic (``--inbound``)."""

INBOUND_PORT = 4999
"""Where a node's inbound relay listens, in the node's namespace. Taken
before any service of the node starts, so none is given it."""

SUBNETS = ipaddress.ip_network("10.213.0.0/16")
"""Where a network's /24 is chosen: one not on any interface already."""

TBF_BURST = "256kb"
"""The token bucket's burst: enough for a 1 Gbit/s rate at a 1 ms tick."""

TBF_LATENCY = "100ms"
"""How long a packet may wait in the token bucket before it is dropped."""


def run(*args: str) -> str:
    """Run one iproute2 command; its output, or an error naming it and why."""
    done = subprocess.run(args, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        message = f"`{' '.join(args)}` failed: {done.stderr.strip()}"
        raise RuntimeError(message)
    return done.stdout


def can_make_networks() -> str | None:
    """Why this machine cannot give nodes network namespaces, or ``None``.

    Tried, not guessed: a namespace and a veth pair, made and removed.
    """
    if shutil.which("ip") is None:
        return "the cluster's network needs ip(8) (iproute2)"
    name = f"dfxprobe{secrets.token_hex(2)}"
    try:
        run(IP, "netns", "add", name)
        run(IP, "link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b")
        run(IP, "link", "set", f"{name}b", "netns", name)
    except RuntimeError as err:
        return f"cannot make a network namespace with a veth pair: {err}"
    finally:
        with contextlib.suppress(RuntimeError):
            run(IP, "link", "del", f"{name}a")
        with contextlib.suppress(RuntimeError):
            run(IP, "netns", "del", name)
    return None


def subnets_in_use() -> set[ipaddress.IPv4Network]:
    """Every IPv4 /24 some interface of this machine has an address in."""
    found = set()
    for address in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", run(IP, "-4", "addr")):
        found.add(ipaddress.ip_network(f"{address}/24", strict=False))
    return found


@dataclasses.dataclass
class Network:
    """A bridge and ``nodes`` network namespaces on it (module doc).

    ``rate`` caps each node's link in each direction (a ``tc`` rate such as
    ``1gbit``); ``None`` leaves it as fast as the machine. ``latency_ms``
    is added to each round trip of a connection into a node (0: none).
    Use as a context manager, or :meth:`up` then :meth:`down`.
    """

    nodes: int
    rate: str | None = "1gbit"
    latency_ms: float = 0.0
    relays: list[subprocess.Popen[str]] = dataclasses.field(default_factory=list)
    tag: str = dataclasses.field(default_factory=lambda: secrets.token_hex(2))
    subnet: ipaddress.IPv4Network | None = None
    made: list[str] = dataclasses.field(default_factory=list)

    @property
    def bridge(self) -> str:
        """The bridge's interface name."""
        return f"dfx{self.tag}br"

    def namespace(self, node: int) -> str:
        """Node ``node``'s network namespace (1-based)."""
        return f"dfx{self.tag}n{node}"

    def host_end(self, node: int) -> str:
        """The bridge's end of node ``node``'s veth pair."""
        return f"dfx{self.tag}v{node}"

    def _address(self, index: int) -> str:
        if self.subnet is None:
            message = "the network is not up"
            raise RuntimeError(message)
        return str(self.subnet.network_address + index)

    @property
    def host_ip(self) -> str:
        """The bridge's address: the head's, the driver's, the relays'."""
        return self._address(1)

    def node_ip(self, node: int) -> str:
        """Node ``node``'s address."""
        return self._address(node + 1)

    def enter(self, node: int) -> list[str]:
        """The command prefix that runs a command in node ``node``'s namespace."""
        return [NSENTER, f"--net=/run/netns/{self.namespace(node)}", "--"]

    def __enter__(self) -> Network:
        """Make the bridge and the nodes' namespaces."""
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove them."""
        self.down()

    def up(self) -> None:
        """Make the bridge, then each node's namespace and link."""
        taken = subnets_in_use()
        self.subnet = next(
            net for net in SUBNETS.subnets(new_prefix=24) if net not in taken
        )
        prefix = self.subnet.prefixlen
        run(IP, "link", "add", self.bridge, "type", "bridge")
        self.made.append(f"link:{self.bridge}")
        run(IP, "addr", "add", f"{self.host_ip}/{prefix}", "dev", self.bridge)
        run(IP, "link", "set", self.bridge, "up")
        for node in range(1, self.nodes + 1):
            self._add_node(node, prefix)

    def _add_node(self, node: int, prefix: int) -> None:
        ns, host_end = self.namespace(node), self.host_end(node)
        inner = f"dfx{self.tag}e"
        run(IP, "netns", "add", ns)
        self.made.append(f"netns:{ns}")
        run(IP, "link", "add", host_end, "type", "veth", "peer", "name", inner)
        self.made.append(f"link:{host_end}")
        run(IP, "link", "set", inner, "netns", ns)
        run(IP, "link", "set", host_end, "master", self.bridge)
        run(IP, "link", "set", host_end, "up")
        inside = [IP, "-n", ns]
        run(*inside, "link", "set", inner, "name", "eth0")
        run(*inside, "addr", "add", f"{self.node_ip(node)}/{prefix}", "dev", "eth0")
        run(*inside, "link", "set", "eth0", "up")
        run(*inside, "link", "set", "lo", "up")
        if self.rate:
            # Both directions: the bridge's end shapes what reaches the node.
            for where in ([TC], [TC, "-n", ns]):
                device = host_end if where == [TC] else "eth0"
                run(*where, "qdisc", "add", "dev", device, "root", "tbf", "rate",
                    self.rate, "burst", TBF_BURST, "latency", TBF_LATENCY)  # fmt: skip
        if self.latency_ms > 0:
            self._delay_inbound(node)

    def _delay_inbound(self, node: int) -> None:
        """Start node ``node``'s inbound relay, then redirect to it.

        Every connection arriving on the node's link (module doc).
        """
        if shutil.which(NFT) is None:
            message = "latency between nodes needs nft(8) (nftables)"
            raise RuntimeError(message)
        inside = [IP, "netns", "exec", self.namespace(node)]
        # On the node's address: a redirect sends there (to the address of
        # the link the connection came in on).
        listen = self.node_ip(node)
        command = [sys.executable, str(RELAY), "--inbound", listen, str(INBOUND_PORT)]
        process = subprocess.Popen(  # noqa: S603 - our own relay
            [*inside, *command, str(self.latency_ms)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.relays.append(process)
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("ready "):
            message = f"node {node}'s inbound relay did not start: {line!r}"
            raise RuntimeError(message)
        # The nat table sees a connection's first packet only: replies to a
        # connection the node opened are not redirected.
        rule = (
            "table ip dfx { chain inbound { type nat hook prerouting priority dstnat; "
            f'policy accept; iifname "eth0" tcp dport != {INBOUND_PORT} '
            f"redirect to :{INBOUND_PORT}; }}; }}"
        )
        run(*inside, NFT, rule)

    def cut(self, node: int) -> None:
        """Take node ``node``'s link down: its address answers nothing more."""
        run(IP, "link", "set", self.host_end(node), "down")

    def down(self) -> None:
        """Remove what :meth:`up` made; missing parts are fine.

        The inbound relays first, then the rest newest first.
        """
        for process in self.relays:
            process.kill()
            process.wait()
        self.relays.clear()
        remove(self.made)
        self.made.clear()

    def record(self) -> dict[str, Any]:
        """What :func:`remove_recorded` needs to remove this network."""
        return {"made": list(self.made), "relays": [p.pid for p in self.relays]}


def remove(made: list[str]) -> None:
    """Remove each ``link:NAME`` and ``netns:NAME`` of ``made``, newest first."""
    for item in reversed(made):
        kind, _, name = item.partition(":")
        with contextlib.suppress(RuntimeError):
            run(IP, "netns" if kind == "netns" else "link", "del", name)


def remove_recorded(record: dict[str, Any]) -> None:
    """Remove a network from what :meth:`Network.record` wrote."""
    for pid in record.get("relays", []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    remove(list(record.get("made", [])))
