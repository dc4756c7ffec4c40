"""The agent-daemon messages: round trips, conversion to the core's Node, versioning."""

from __future__ import annotations

import msgspec
import pytest

from common.core import Device, Node
from common.wire import (
    SCHEMA_VERSION,
    Card,
    Inventory,
    ResyncRequest,
    WireError,
    decode_inventory,
    decode_resync,
    encode,
    inventory_subject,
)


def _inventory(cards: list[Card], cordoned: list[str] | None = None) -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node="node-a", agent_version="0.1.0",
                     instance="abc", sequence=3, timestamp=1700000000.5, reason="change",
                     heartbeat_interval=10.0, cards=cards, cordoned=cordoned or [])


CARDS = [
    Card(uuid="GPU-a", index=0, type="NVIDIA-Tesla T4", memory=15360, numa=0, links={},
         processes=2, sm_count=40, process_memory=1800),
    Card(uuid="GPU-b", index=1, type="NVIDIA-Tesla T4", memory=15360, numa=1,
         links={"GPU-a": 4}, health=False, health_detail="critical XID 79"),
]


def test_a_card_carries_every_device_field() -> None:
    assert set(Device.__struct_fields__) <= set(Card.__struct_fields__)


def test_inventory_survives_encoding() -> None:
    message = _inventory(CARDS, ["GPU-b"])
    assert decode_inventory(encode(message)) == message


def test_to_node_gives_the_core_plain_devices_and_the_cordon_annotation() -> None:
    node = _inventory(CARDS, ["GPU-a", "GPU-b"]).to_node()
    assert node == Node(
        name="node-a",
        devices=[
            Device(uuid="GPU-a", index=0, type="NVIDIA-Tesla T4", memory=15360, numa=0,
                   links={}, processes=2),
            Device(uuid="GPU-b", index=1, type="NVIDIA-Tesla T4", memory=15360, numa=1,
                   links={"GPU-a": 4}, health=False),
        ],
        annotations={"hami.io/device-cordon": "GPU-a,GPU-b"},
    )
    assert all(type(device) is Device for device in node.devices)


def test_to_node_without_cordons_has_no_annotation() -> None:
    assert _inventory(CARDS).to_node().annotations == {}


def test_unknown_topology_stays_unknown_and_no_nvlink_stays_empty() -> None:
    unknown = Card(uuid="GPU-c", index=2, type="NVIDIA-Tesla T4", memory=15360)
    devices = _inventory([CARDS[0], unknown]).to_node().devices
    assert devices[0].links == {}
    assert devices[1].links is None


def test_another_schema_version_is_refused_by_name() -> None:
    data = msgspec.msgpack.encode({"schema": SCHEMA_VERSION + 1, "node": "x"})
    with pytest.raises(WireError, match=f"schema version {SCHEMA_VERSION + 1} is not supported"):
        decode_inventory(data)


def test_a_malformed_message_is_refused_with_the_field() -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"][0]["memory"] = -1
    with pytest.raises(WireError, match=r"malformed inventory message: .*memory"):
        decode_inventory(msgspec.msgpack.encode(document))
    with pytest.raises(WireError, match="malformed"):
        decode_inventory(b"\x00not msgpack")


def test_information_fields_from_a_newer_agent_are_accepted() -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"][0]["temperature_c"] = 61
    assert decode_inventory(msgspec.msgpack.encode(document)).cards[0] == CARDS[0]


def test_resync_requests_address_every_agent_or_the_named_nodes() -> None:
    assert decode_resync(b"").includes("node-a")
    named = decode_resync(encode(ResyncRequest(requested_by="daemon", nodes=["node-b"])))
    assert named.includes("node-b")
    assert not named.includes("node-a")
    with pytest.raises(WireError, match="malformed resync request"):
        decode_resync(b"\xc1")


def test_subjects_put_the_node_name_last() -> None:
    node = "ip-10-0-0-1.ec2.internal"
    assert inventory_subject(node) == f"pyhami.inventory.{node}"
