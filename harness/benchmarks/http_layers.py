"""The extender's HTTP layer compared: the same no-op verb (ExtenderArgs decoded and
checked as /filter does, the first node answered) behind aiohttp's web framework,
aiohttp's low-level server, and pyhami's lean reader (scheduler/web/fastpath.py).

    python harness/benchmarks/http_layers.py [--names 1000] [--requests 3000]

Each server runs in a process of its own on uvloop, as the daemon does; one client
process sends the requests one after the other over one kept-alive connection, as a
raw socket (so that the client's own cost is small and the same for all). Printed per
layer: the client-observed p50 and p99, the server's CPU per request (utime+stime from
/proc), and its resident memory after the run. docs/performance.md, "The HTTP layer",
holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import uvloop
from aiohttp import web

from pyhami.bench.extender import cpu_seconds, daemon_memory
from pyhami.bench.floor import noop_verb
from pyhami.natsserver import free_port
from scheduler.web.fastpath import VerbsServer
from scheduler.web.limits import EXTENDER_BODY_LIMIT, read_body

LAYERS = ("aiohttp-web", "aiohttp-lowlevel", "lean-reader")


def serve(layer: str, port: int) -> None:
    verb = noop_verb()

    async def handle(request: web.BaseRequest) -> web.Response:
        status, content_type, body = await verb(await read_body(request, EXTENDER_BODY_LIMIT))
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async def main() -> None:
        if layer == "aiohttp-web":
            app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
            app.add_routes([web.post("/noop", handle)])
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        elif layer == "aiohttp-lowlevel":
            async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
                if request.method == "POST" and request.path == "/noop":
                    return await handle(request)
                return web.Response(status=404)

            server = web.Server(dispatch, access_log=None)
            await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
        else:
            await VerbsServer.start(web.Application(), {"/noop": verb}, ("127.0.0.1", port),
                                    None)
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def _body(names: int) -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "bench", "uid": "u-1",
                        "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},
           "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {
               "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}]}}
    return json.dumps({"Pod": pod, "NodeNames": [f"node-{i:05d}" for i in range(names)]},
                      separators=(",", ":")).encode()


def _read_answer(stream: socket.socket, pending: bytearray) -> None:
    while b"\r\n\r\n" not in pending:
        pending += stream.recv(65536)
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    assert head.startswith(b"HTTP/1.1 200"), head
    while len(rest) < length:
        rest += stream.recv(65536)
    pending[:] = rest[length:]


def measure(layer: str, names: int, requests: int) -> dict[str, float | str | int | None]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "serve", layer, str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        body = _body(names)
        request = (b"POST /noop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                   b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        samples = []
        with socket.create_connection(("127.0.0.1", port)) as stream:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending = bytearray()
            for _ in range(200):  # warm up
                stream.sendall(request)
                _read_answer(stream, pending)
            cpu_before = cpu_seconds(server.pid)
            for _ in range(requests):
                started = time.perf_counter()
                stream.sendall(request)
                _read_answer(stream, pending)
                samples.append((time.perf_counter() - started) * 1e3)
            cpu_after = cpu_seconds(server.pid)
        samples.sort()
        return {"layer": layer, "names": names,
                "p50_ms": round(statistics.median(samples), 3),
                "p99_ms": round(samples[int(len(samples) * 0.99)], 3),
                "server_cpu_ms_per_request":
                    None if cpu_before is None or cpu_after is None
                    else round((cpu_after - cpu_before) / requests * 1e3, 3),
                "server_rss_mb": daemon_memory(server.pid)["daemon_rss_mb"]}
    finally:
        server.kill()
        server.wait()


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each layer measured this many times, the layers alternating")
    args = parser.parse_args()
    for names in args.names:
        for _ in range(args.rounds):
            for layer in LAYERS:
                print(json.dumps(measure(layer, names, args.requests)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
