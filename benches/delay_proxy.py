#!/usr/bin/env python3
"""A TCP proxy that delays every chunk it reads, in each direction, by DELAY_MS before passing
it on (order kept, throughput not limited): a database one network hop away, on loopback.

    python3 benches/delay_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS

benches/cluster_compare.sh starts it when DB_DELAY_MS is set.
"""
import asyncio
import sys
import time


async def pipe(reader, writer, delay):
    queue = asyncio.Queue()

    async def forward():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(forward())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.put_nowait((time.monotonic() + delay, data))
    finally:
        queue.put_nowait((0, None))
        await sender


async def main(listen_port, host, port, delay):
    async def serve(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pipe(client_reader, server_writer, delay),
            pipe(server_reader, client_writer, delay),
            return_exceptions=True,
        )

    server = await asyncio.start_server(serve, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, host, target, delay_ms = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    asyncio.run(main(int(listen), host, int(target), float(delay_ms) / 1000.0))
