"""A standalone daemon that takes the lease fences the pods no node holds before it
decides: a bind its predecessor sent while it still decided can no longer land after
that (it would bind a pod on cards the new holder may give another: an over-committed
card, seen in the NATS cluster fault test), and one that landed first is read
(issue 29)."""

from __future__ import annotations

import nats
import pytest

from common.core import PodManifest
from common.core.pod import ObjectMeta
from pyhami.natsserver import LocalNatsServer
from scheduler.cluster import ClusterError
from scheduler.cluster.standalone import StandaloneCluster


@pytest.mark.parametrize("bind_lands", ["after-the-fence", "before-the-fence"])
async def test_a_predecessors_bind_cannot_land_after_the_fence(
        jetstream_server: LocalNatsServer, bind_lands: str) -> None:
    old_client = await nats.connect(jetstream_server.url)
    new_client = await nats.connect(jetstream_server.url)
    try:
        old = await StandaloneCluster.open(old_client, refusal=lambda: None)
        pod = await old.submit(PodManifest(metadata=ObjectMeta(name="late")))
        await old.submit(PodManifest(metadata=ObjectMeta(name="other")))
        new = await StandaloneCluster.open(new_client, refusal=lambda: None)
        await new.reload()  # the new holder reads every pod as it takes the lease
        refused: ClusterError | None = None
        if bind_lands == "before-the-fence":
            await old.bind("default", "late", pod.uid, "n1", {})
            changed = await new.fence()
        else:
            changed = await new.fence()
            with pytest.raises(ClusterError) as raised:
                await old.bind("default", "late", pod.uid, "n1", {})
            refused = raised.value
        seen = await new.get_pod("default", "late")
        stored = await StandaloneCluster.open(old_client, refusal=lambda: None)
        await stored.reload()
        in_the_store = await stored.get_pod("default", "late")
    finally:
        await old_client.close()
        await new_client.close()
    assert seen is not None and in_the_store is not None
    if bind_lands == "before-the-fence":
        assert changed == 1
        assert seen.node == in_the_store.node == "n1"  # read, and booked
    else:
        assert changed == 0
        assert refused is not None and "changed meanwhile" in str(refused)
        assert seen.node is None and in_the_store.node is None  # nothing landed
