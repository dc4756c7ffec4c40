"""The HTTP floor ``pyhami bench extender`` sets /filter beside: the daemon's extender
listener serving one verb, ``/noop``, in a process of its own.

``/noop`` decodes and checks ExtenderArgs as the daemon's /filter does (the same decoder
and name checks) and answers at once with the first node, behind the same listener
(``scheduler.web.fastpath.VerbsServer``: the lean HTTP/1.1 reader, uvloop, the daemon's
young-generation threshold and frozen start-up objects): what the HTTP layer and the
decoding cost, without a decision. The bench keeps its own baseline here; the daemon
serves only its verbs.

    python -m pyhami.bench.floor PORT    # "ready" on stdout once listening, then until killed
"""

from __future__ import annotations

import asyncio
import gc
import sys

import msgspec
import uvloop
from aiohttp import web

from common.core.names import InvalidName
from scheduler.cli import GC_YOUNG_THRESHOLD
from scheduler.web.extender import JSON, TEXT, Answer, BodyVerb
from scheduler.web.fastpath import VerbsServer
from scheduler.web.protocol import ExtenderArgsDecoder, ExtenderFilterResult, check_extender_args

PATH = "/noop"
HOST = "127.0.0.1"


def noop_verb() -> BodyVerb:
    """Decodes and checks ExtenderArgs as /filter does and answers at once with the first
    node; a body that does not decode is answered 400, as /filter answers it."""
    decoder = ExtenderArgsDecoder()
    encoder = msgspec.json.Encoder()

    async def answer_at_once(body: bytes) -> Answer:
        try:
            args = decoder.decode(body)
            check_extender_args(args)
        except (msgspec.DecodeError, InvalidName) as error:
            return Answer(400, TEXT, f"malformed ExtenderArgs: {error}\n".encode())
        first = list((args.node_names or ())[:1])
        return Answer(200, JSON, encoder.encode(ExtenderFilterResult(node_names=first)))

    return answer_at_once


async def serve(port: int) -> None:
    """Listen on loopback ``port`` until cancelled; "ready" on stdout once listening."""
    server = await VerbsServer.start(web.Application(), {PATH: noop_verb()}, (HOST, port), None)
    try:
        gc.freeze()  # as the daemon does once started: its start-up objects out of the GC's way
        print("ready", flush=True)
        await asyncio.Event().wait()
    finally:
        await server.cleanup()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m pyhami.bench.floor PORT", file=sys.stderr)
        return 2
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    uvloop.run(serve(int(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
