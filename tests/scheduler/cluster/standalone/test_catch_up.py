"""A standalone daemon that has just taken the lease reads the pods again a while later:
a bind its predecessor sent while it still decided may land after the new holder's
``reload`` (issue 29, the NATS cluster fault test)."""

from __future__ import annotations

import nats

from common.core import PodManifest
from common.core.pod import ObjectMeta
from pyhami.natsserver import LocalNatsServer
from scheduler.cluster import PodChange
from scheduler.cluster.standalone import StandaloneCluster


async def test_a_bind_landing_after_the_reload_is_taken_and_told(
        jetstream_server: LocalNatsServer) -> None:
    old_client = await nats.connect(jetstream_server.url)
    new_client = await nats.connect(jetstream_server.url)
    try:
        old = await StandaloneCluster.open(old_client, refusal=lambda: None)
        pod = await old.submit(PodManifest(metadata=ObjectMeta(name="late")))
        new = await StandaloneCluster.open(new_client, refusal=lambda: None)
        await new.reload()  # the new holder reads every pod as it takes the lease
        await old.bind("default", "late", pod.uid, "n1", {"hami.io/vgpu-node": "n1"})
        unseen = await new.get_pod("default", "late")

        taken = await new.catch_up()
        seen = await new.get_pod("default", "late")
        changes = new.changes()
        told: PodChange = await anext(changes)
        again = await new.catch_up()
    finally:
        await old_client.close()
        await new_client.close()
    assert unseen is not None and unseen.node is None
    assert taken == 1 and again == 0
    assert seen is not None and seen.node == "n1"
    assert (told.pod.key, told.pod.node, told.deleted) == ("default/late", "n1", False)
