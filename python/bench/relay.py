"""A TCP relay that adds latency: a service as if it were far away.

    python relay.py LISTEN_HOST TARGET_HOST:PORT DELAY_MS
    python relay.py --inbound LISTEN_HOST PORT DELAY_MS

Listens on a free port of ``LISTEN_HOST``, prints ``ready PORT`` once it
does, and forwards each connection to ``TARGET``. Every chunk is held for
half of ``DELAY_MS`` in each direction, in order, so a request and its
answer take ``DELAY_MS`` longer than they would: the first byte of an S3
GET arrives a round trip later, as from an endpoint ``DELAY_MS`` away.
Bandwidth is not limited here (the nodes' links are, by ``tc``).

With ``--inbound`` it listens on ``PORT`` and forwards each connection to
where it was first addressed (``SO_ORIGINAL_DST``): a node's firewall
redirects every connection arriving on its link here
(:meth:`network.Network.up`), so each reaches its service a round trip of
``DELAY_MS`` later, as from a machine that far away.

The simulated cluster (:mod:`cluster`) starts one per service its nodes
reach, and one inbound relay per node: its namespaces cannot see this
machine's loopback, and ``netem``, which would add the delay in the kernel,
is missing from some kernels. Runs until killed; needs only the standard
library.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys

CHUNK = 256 * 1024
"""Bytes read at once from either side."""

SO_ORIGINAL_DST = 80
"""Linux's socket option (``SOL_IP``) for a redirected connection's first
destination, as ``struct sockaddr_in``."""


async def pipe(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, one_way: float
) -> None:
    """Copy ``source`` to ``sink``, each chunk ``one_way`` seconds late.

    Reading goes on while chunks wait, so the delay adds latency, not a
    round trip per chunk; end of stream is passed on as a half close.
    """
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def take() -> None:
        while data := await source.read(CHUNK):
            held.put_nowait((loop.time() + one_way, data))
        held.put_nowait((loop.time() + one_way, b""))

    taking = asyncio.create_task(take())
    try:
        while True:
            due, data = await held.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if sink.can_write_eof():
                    sink.write_eof()
                return
            sink.write(data)
            await sink.drain()
    finally:
        taking.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await taking


async def relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    one_way: float,
) -> None:
    """One connection: to the target, then both directions until both end."""
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            pipe(client_reader, server_writer, one_way),
            pipe(server_reader, client_writer, one_way),
        )
    except ConnectionError:
        pass
    finally:
        for writer in (client_writer, server_writer):
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def original_destination(writer: asyncio.StreamWriter) -> tuple[str, int]:
    """Where the connection of ``writer`` was addressed before a redirect."""
    sock = writer.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    (port,) = struct.unpack_from("!H", raw, 2)
    return socket.inet_ntoa(raw[4:8]), port


async def serve(
    listen_host: str, target: tuple[str, int] | None, delay_ms: float, port: int = 0
) -> None:
    """Listen, say where, relay until killed.

    With no ``target``, each connection goes to its original destination.
    """
    one_way = delay_ms / 2000

    async def accept(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        to = target if target is not None else original_destination(writer)
        await relay(reader, writer, to, one_way)

    server = await asyncio.start_server(accept, listen_host, port)
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """``relay.py LISTEN_HOST TARGET_HOST:PORT DELAY_MS``, or ``--inbound``."""
    args = sys.argv[1:]
    try:
        if args[:1] == ["--inbound"]:
            listen_host, port, delay = args[1:]
            asyncio.run(serve(listen_host, None, float(delay), int(port)))
            return
        listen_host, target, delay = args
    except ValueError:
        sys.exit("\n".join(line.strip() for line in __doc__.splitlines()[2:4]))
    host, _, port = target.rpartition(":")
    asyncio.run(serve(listen_host, (host, int(port)), float(delay)))


if __name__ == "__main__":
    main()
