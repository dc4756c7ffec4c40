"""A TCP relay on loopback that can cut its clients off without a word, as a network
partition does: while cut, the bytes each way are dropped and the connections stay open,
so neither end learns of it until its own timeouts fire."""

from __future__ import annotations

import asyncio
import contextlib

from pyhami.natsserver import free_port

CHUNK = 65536


class Partition:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def heal(self) -> None:
        """Relay again; the connections the partition spoiled are closed, so the client
        connects afresh instead of reading a stream with a hole in it."""
        self.cut = False
        for writer in list(self._writers):
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:  # a new connection during the partition hears nothing either
            self._writers.add(writer)
            with contextlib.suppress(OSError):
                while await reader.read(CHUNK):
                    pass
            self._writers.discard(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, upstream_writer))
        try:
            await asyncio.gather(self._pipe(reader, upstream_writer),
                                 self._pipe(upstream_reader, writer))
        finally:
            for end in (writer, upstream_writer):
                self._writers.discard(end)
                end.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                if self.cut:
                    continue
                writer.write(data)
                await writer.drain()
        writer.close()
