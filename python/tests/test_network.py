"""The simulated cluster's network: latency between nodes.

``python/bench/network.py`` gives each node a network namespace on a bridge.
With ``latency_ms``, a firewall rule in each node redirects every TCP
connection arriving on its link to a relay in the node (``relay.py
--inbound``), which forwards it to where it was addressed, holding each
chunk half the delay in each direction. These tests run a real echo server
in one node and clients in another node and on the bridge.

Needs root and ip(8) for the namespaces (skipped, saying so, where they
cannot be made) and nft(8), which the test command installs.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import network  # noqa: E402 - python/bench is on the path now

if TYPE_CHECKING:
    from collections.abc import Iterator

NOT_POSSIBLE = network.can_make_networks()
pytestmark = pytest.mark.skipif(
    NOT_POSSIBLE is not None, reason=f"no network namespaces here: {NOT_POSSIBLE}"
)

DELAY_MS = 80.0
"""The round trip added between nodes: well above this machine's own."""

ECHO_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print("ready", server.getsockname()[1], flush=True)
while True:
    conn, peer = server.accept()
    with conn:
        conn.sendall(peer[0].encode().ljust(64))
        while data := conn.recv(65536):
            conn.sendall(data)
"""
"""Answers each connection with the peer address it sees, then echoes."""

ECHO_CLIENT = """
import json, os, socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def read(n):
    got = b""
    while len(got) < n:
        got += conn.recv(n - len(got))
    return got
peer = read(64).decode().strip()
rtts = []
for _ in range(3):
    start = time.monotonic()
    conn.sendall(b"x")
    read(1)
    rtts.append(time.monotonic() - start)
payload = os.urandom(1 << 20)
conn.sendall(payload)
echoed = read(len(payload))
print(json.dumps({"peer": peer, "rtts": rtts, "intact": echoed == payload}))
"""
"""Round trips of one byte, then a mebibyte there and back."""


def echo(command: list[str], host: str, port: int) -> dict[str, object]:
    """The echo client's findings, run with ``command`` as its prefix."""
    done = subprocess.run(
        [*command, sys.executable, "-c", ECHO_CLIENT, host, str(port)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found: dict[str, object] = json.loads(done.stdout)
    return found


@contextlib.contextmanager
def echo_server(net: network.Network, node: int) -> Iterator[int]:
    """An echo server on node ``node``'s address; its port."""
    server = subprocess.Popen(
        [*net.enter(node), sys.executable, "-c", ECHO_SERVER, net.node_ip(node)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        yield int(ready[1])
    finally:
        server.kill()
        server.wait()


def test_a_connection_into_a_node_takes_the_latency_and_keeps_its_bytes() -> None:
    with network.Network(nodes=2, rate=None, latency_ms=DELAY_MS) as net:
        server_ip = net.node_ip(2)
        with echo_server(net, 2) as port:
            from_node = echo(net.enter(1), server_ip, port)
            from_bridge = echo([], server_ip, port)
            from_itself = echo(net.enter(2), server_ip, port)

    for found in (from_node, from_bridge):
        # The server saw the node's own relay, not the client: redirected.
        assert found["peer"] == server_ip, found
        assert found["intact"] is True
        rtts = found["rtts"]
        assert isinstance(rtts, list)
        assert min(rtts) >= DELAY_MS / 1000 * 0.95, rtts
    # A node's connection to itself does not cross its link.
    assert from_itself["intact"] is True
    assert from_itself["peer"] == server_ip


def test_a_network_without_latency_redirects_nothing() -> None:
    with network.Network(nodes=2, rate=None) as net:
        with echo_server(net, 2) as port:
            from_node = echo(net.enter(1), net.node_ip(2), port)
        assert net.relays == []
    # The server saw the client itself.
    assert from_node["peer"] == net.node_ip(1)
    assert from_node["intact"] is True
