"""ResourceQuota writes through a NATS outage (docs/reliability.md), as the pod writes'
(test_standalone_outage): a 503 means nothing was stored and nothing applied, also once
NATS is back and after the daemon restarts.

The outages are real: nats-server killed and started again on its port, or frozen
(SIGSTOP) so that a write leaves the daemon and gets no answer until the server resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import msgspec

from common.core.quota import QuotaStanding
from tests.harness import Lab, eventually, stored_entries
from tests.quotas import NAMESPACE, QUOTAS, call, quota, standings

KEPT = [QuotaStanding(NAMESPACE, "kept", "nvidia.com/gpumem", 0, 4000)]


async def stored_quotas(nats_url: str) -> dict[str, str]:
    """The quotas in the bucket, read with a client of our own: key -> GPU memory limit."""
    entries = await stored_entries(nats_url, lambda key: key.startswith("_resourcequota."))
    return {key: msgspec.msgpack.decode(value)["manifest"]["spec"]["hard"][
                "limits.nvidia.com/gpumem"] for key, value in entries.items()}


@contextlib.asynccontextmanager
async def watching_the_book(lab: Lab) -> AsyncIterator[list[list[QuotaStanding]]]:
    """Every distinct state of the daemon's quotas while the block runs, read every 10 ms:
    a refused write must not show up even for a moment."""
    seen: list[list[QuotaStanding]] = [standings(lab.daemon)]

    async def sample() -> None:
        while True:
            now = standings(lab.daemon)
            if now != seen[-1]:
                seen.append(now)
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    try:
        yield seen
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


async def test_quota_writes_while_nats_is_down_are_refused_and_never_applied(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    url = f"{lab.daemon.url}{QUOTAS}"
    assert (await call(http, "POST", url, json_body=quota("kept", memory=4000)))[0] == 201
    assert standings(lab.daemon) == KEPT

    lab.nats.kill()
    await asyncio.sleep(0.3)  # the daemon's client sees the connection drop
    async with watching_the_book(lab) as seen:
        for method, path, body in (
                ("POST", "", quota("refused", memory=1000)),
                ("PUT", f"/{NAMESPACE}/kept", quota("kept", memory=9000)),
                ("DELETE", f"/{NAMESPACE}/kept", None)):
            started = time.monotonic()
            status, text = await call(http, method, f"{url}{path}", json_body=body)
            assert (status, text.endswith("the NATS connection is down; nothing was "
                                          "written\n")) == (503, True)
            assert time.monotonic() - started < 1.0  # refused, not buffered until a timeout
        assert seen == [KEPT]
    assert [q["metadata"]["name"] for q in
            msgspec.json.decode((await call(http, "GET", url))[1])["items"]] == ["kept"]

    lab.nats.start()

    async def writing_again() -> bool:
        return (await call(http, "POST", url, json_body=quota("after", memory=1000)))[0] == 201

    await eventually(writing_again, "the daemon to write the store again", timeout=30)
    assert await stored_quotas(lab.nats.url) == {
        f"_resourcequota.{NAMESPACE}.kept": "4000", f"_resourcequota.{NAMESPACE}.after": "1000"}

    await lab.restart_daemon()
    assert [s.quota for s in standings(lab.daemon)] == ["after", "kept"]  # no ghost
    assert standings(lab.daemon)[1] == KEPT[0]


async def test_a_quota_write_that_got_no_answer_is_undone_and_never_applied(
        lab: Lab, http: aiohttp.ClientSession) -> None:
    url = f"{lab.daemon.url}{QUOTAS}"
    assert (await call(http, "POST", url, json_body=quota("kept", memory=4000)))[0] == 201

    async with watching_the_book(lab) as seen:
        lab.nats.pause()  # the writes leave the daemon, and no answer comes
        try:
            answer = await call(http, "POST", url, json_body=quota("ghost", memory=1))
            assert answer[0] == 503, answer
            assert (await call(http, "PUT", f"{url}/{NAMESPACE}/kept",
                               json_body=quota("kept", memory=9000)))[0] == 503
        finally:
            lab.nats.resume()  # both writes land now

        async def settled() -> bool:
            return await stored_quotas(lab.nats.url) == {
                f"_resourcequota.{NAMESPACE}.kept": "4000"}

        await eventually(settled, "the late writes to be undone")

        async def deciding_again() -> bool:
            # Cut off from NATS past its renew deadline, the daemon stood by; it decides
            # again once it has its lease back.
            async with http.get(f"{lab.daemon.url}/readyz") as answer:
                return answer.status == 200

        await eventually(deciding_again, "the daemon to take its lease back")
        await asyncio.sleep(1.5)  # the watch has brought the late writes and their undoing
        assert seen == [KEPT]

    await lab.restart_daemon()
    assert standings(lab.daemon) == KEPT
    # The client's retry now succeeds, as a first write would.
    assert (await call(http, "POST", f"{lab.daemon.url}{QUOTAS}",
                       json_body=quota("ghost", memory=1)))[0] == 201
