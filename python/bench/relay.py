"""A TCP relay that adds latency: a service as if it were far away.

    python relay.py LISTEN_HOST TARGET_HOST:PORT DELAY_MS

Listens on a free port of ``LISTEN_HOST``, prints ``ready PORT`` once it
does, and forwards each connection to ``TARGET``. Every chunk is held for
half of ``DELAY_MS`` in each direction, in order, so a request and its
answer take ``DELAY_MS`` longer than they would: the first byte of an S3
GET arrives a round trip later, as from an endpoint ``DELAY_MS`` away.
Bandwidth is not limited here (the nodes' links are, by ``tc``).

The simulated cluster (:mod:`cluster`) starts one per service its nodes
reach: its namespaces cannot see this machine's loopback, and ``netem``,
which would add the delay in the kernel, is missing from some kernels.
Runs until killed; needs only the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

CHUNK = 256 * 1024
"""Bytes read at once from either side."""


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


async def serve(listen_host: str, target: tuple[str, int], delay_ms: float) -> None:
    """Listen, say where, relay until killed."""
    one_way = delay_ms / 2000

    async def accept(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await relay(reader, writer, target, one_way)

    server = await asyncio.start_server(accept, listen_host, 0)
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """``relay.py LISTEN_HOST TARGET_HOST:PORT DELAY_MS``."""
    try:
        listen_host, target, delay = sys.argv[1:]
    except ValueError:
        sys.exit(__doc__.splitlines()[2].strip())
    host, _, port = target.rpartition(":")
    asyncio.run(serve(listen_host, (host, int(port)), float(delay)))


if __name__ == "__main__":
    main()
