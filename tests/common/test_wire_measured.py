"""The measured usage an inventory carries (``Inventory.measured``): round trips, the
bounds a decoder holds every field to, and interplay with daemons and agents that predate
it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from common.wire import (
    MEASURED_CONTAINERS_MAX,
    SCHEMA_VERSION,
    Inventory,
    Measured,
    MeasuredCard,
    MeasuredContainer,
    ReportedCard,
    WireError,
    decode_inventory,
    encode,
)

CARDS = [ReportedCard(uuid=f"GPU-{i}", index=i, type="NVIDIA-Tesla T4", memory=15360,
                      numa=0, links={}) for i in range(2)]
MEASURED = Measured(
    at=1700000000.25,
    cards=[MeasuredCard(uuid="GPU-0", memory_used=4200, utilization=37),
           MeasuredCard(uuid="GPU-1")],
    containers=[
        MeasuredContainer(pod_uid="6b1c8f1e-0000-4000-8000-000000000001", container="train",
                          device_uuid="GPU-0", memory_used=4000, utilization=140,
                          memory_limit=8000, source="hami-core"),
        MeasuredContainer(pod_uid="6b1c8f1e-0000-4000-8000-000000000002", container="",
                          device_uuid="GPU-0", memory_used=200, utilization=0,
                          source="nvml")],
    dropped=3)


def _inventory(measured: Measured | None = MEASURED) -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node="node-a", agent_version="0.1.0",
                     instance="abc", sequence=1, timestamp=1700000000.5, reason="change",
                     heartbeat_interval=10.0, cards=CARDS, measured=measured)


def _document() -> dict[str, Any]:
    document: dict[str, Any] = msgspec.to_builtins(_inventory())
    return document


def test_measured_usage_survives_encoding() -> None:
    assert decode_inventory(encode(_inventory())) == _inventory()


def test_an_inventory_without_measured_usage_decodes_to_none() -> None:
    document = _document()
    del document["measured"]
    assert decode_inventory(msgspec.msgpack.encode(document)).measured is None


def test_a_daemon_that_predates_measured_usage_ignores_it() -> None:
    # An older daemon's Inventory: the same fields, less ``measured``; unknown fields pass.
    older = msgspec.defstruct(
        "OlderInventory",
        [(name, object) for name in Inventory.__struct_fields__ if name != "measured"],
        kw_only=True)
    decoded = msgspec.msgpack.decode(encode(_inventory()), type=older)
    assert not hasattr(decoded, "measured")
    assert msgspec.structs.asdict(decoded)["node"] == "node-a"


def _set(document: dict[str, Any], path: str, value: object) -> None:
    """Set ``value`` at a dotted path of ``document`` (list positions as numbers)."""
    *parents, last = path.split(".")
    here: Any = document
    for part in parents:
        here = here[int(part)] if part.isdigit() else here[part]
    here[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize(("path", "value", "problem"), [
    ("measured.at", -1.0, "Expected `float` >= 0.0 - at `$.measured.at`"),
    ("measured.at", float("nan"), "at `$.measured.at`"),
    ("measured.at", float("inf"), "at `$.measured.at`"),
    ("measured.dropped", -1, "Expected `int` >= 0 - at `$.measured.dropped`"),
    ("measured.dropped", 2**31, "at `$.measured.dropped`"),
    ("measured.cards.0.memory_used", 2**24 + 1,
     "Expected `int` <= 16777216 - at `$.measured.cards[0].memory_used`"),
    ("measured.cards.0.memory_used", -1, "at `$.measured.cards[0].memory_used`"),
    ("measured.cards.0.utilization", 101,
     "Expected `int` <= 100 - at `$.measured.cards[0].utilization`"),
    ("measured.cards.0.uuid", "GPU 0",
     "matching regex '^[A-Za-z0-9._/-]+$' - at `$.measured.cards[0].uuid`"),
    ("measured.cards.1.uuid", "GPU-0", "`$.measured.cards` lists a card twice"),
    ("measured.containers.0.memory_used", 2**63,
     "at `$.measured.containers[0].memory_used`"),
    ("measured.containers.0.utilization", 10001,
     "Expected `int` <= 10000 - at `$.measured.containers[0].utilization`"),
    ("measured.containers.0.utilization", -5, "at `$.measured.containers[0].utilization`"),
    ("measured.containers.0.memory_limit", 2**24 + 1,
     "at `$.measured.containers[0].memory_limit`"),
    ("measured.containers.0.source", "dcgm", "at `$.measured.containers[0].source`"),
    ("measured.containers.0.pod_uid", "u" * 129,
     "length <= 128 - at `$.measured.containers[0].pod_uid`"),
    ("measured.containers.0.container", "c" * 254,
     "length <= 253 - at `$.measured.containers[0].container`"),
    ("measured.containers.1.device_uuid", "GPU-0;x",
     "matching regex '^[A-Za-z0-9._/-]+$' - at `$.measured.containers[1].device_uuid`"),
    ("measured.containers.1.device_uuid", "", "at `$.measured.containers[1].device_uuid`"),
    ("measured.containers.1", dict(msgspec.to_builtins(MEASURED.containers[0])),
     "`$.measured.containers` lists a container's card twice"),
], ids=["at-negative", "at-nan", "at-infinite", "dropped-negative", "dropped-huge",
        "card-memory-huge", "card-memory-negative", "card-utilization-above-100",
        "card-uuid-characters", "card-twice", "container-memory-huge",
        "container-utilization-huge", "container-utilization-negative", "limit-huge",
        "unknown-source", "pod-uid-long", "container-name-long", "container-uuid-characters",
        "container-uuid-empty", "container-card-twice"])
def test_measured_usage_beyond_its_bounds_refuses_the_inventory_naming_the_field(
        path: str, value: object, problem: str) -> None:
    document = _document()
    _set(document, path, value)
    with pytest.raises(WireError) as raised:
        decode_inventory(msgspec.msgpack.encode(document))
    assert raised.value.result == "rejected"
    assert str(raised.value).startswith("malformed inventory message: ")
    assert problem in str(raised.value)


@pytest.mark.parametrize(("field", "entry", "bound"), [
    ("cards", {"uuid": "GPU-x"}, 256),
    ("containers", {"pod_uid": "u", "container": "c", "device_uuid": "GPU-0",
                    "memory_used": 1, "utilization": 0, "source": "nvml"},
     MEASURED_CONTAINERS_MAX),
], ids=["cards", "containers"])
def test_more_measured_entries_than_the_bound_refuse_the_inventory(
        field: str, entry: dict[str, object], bound: int) -> None:
    document = _document()
    key = "uuid" if field == "cards" else "container"
    entries = [{**entry, key: f"{entry[key]}{i}"} for i in range(bound + 1)]
    document["measured"][field] = entries[:bound]
    measured = decode_inventory(msgspec.msgpack.encode(document)).measured
    assert measured is not None
    assert len(getattr(measured, field)) == bound
    document["measured"][field] = entries
    with pytest.raises(WireError, match=rf"length <= {bound} - at `\$.measured.{field}`"):
        decode_inventory(msgspec.msgpack.encode(document))
