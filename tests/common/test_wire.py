"""The agent-daemon messages: round trips, conversion to the core's Node, versioning."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core import Card, Node
from common.wire import (
    ALLOCATED_SUBJECT_PREFIX,
    SCHEMA_VERSION,
    AllocationOutcome,
    HoldingPod,
    Inventory,
    PendingAllocations,
    PendingPod,
    ReportedCard,
    ResyncRequest,
    WireError,
    allocated_subject,
    allocations_subject,
    decode_inventory,
    decode_outcome,
    decode_pending,
    decode_resync,
    encode,
    inventory_subject,
    subject_node_checked,
)


def _inventory(cards: list[ReportedCard], cordoned: list[str] | None = None) -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node="node-a", agent_version="0.1.0",
                     instance="abc", sequence=3, timestamp=1700000000.5, reason="change",
                     heartbeat_interval=10.0, cards=cards, cordoned=cordoned or [])


CARDS = [
    ReportedCard(uuid="GPU-a", index=0, type="NVIDIA-Tesla T4", memory=15360, numa=0, links={},
                 processes=2, sm_count=40, process_memory=1800),
    ReportedCard(uuid="GPU-b", index=1, type="NVIDIA-Tesla T4", memory=15360, numa=1,
                 links={"GPU-a": 4}, health=False, health_detail="critical XID 79"),
]


def test_a_card_carries_every_device_field() -> None:
    assert set(Card.__struct_fields__) <= set(ReportedCard.__struct_fields__)


def test_inventory_survives_encoding() -> None:
    message = _inventory(CARDS, ["GPU-b"])
    assert decode_inventory(encode(message)) == message


def test_to_node_gives_the_core_plain_devices_and_the_cordon_annotation() -> None:
    node = _inventory(CARDS, ["GPU-a", "GPU-b"]).to_node()
    assert node == Node(
        name="node-a",
        cards=[
            Card(uuid="GPU-a", index=0, type="NVIDIA-Tesla T4", memory=15360, numa=0,
                 links={}, processes=2),
            Card(uuid="GPU-b", index=1, type="NVIDIA-Tesla T4", memory=15360, numa=1,
                 links={"GPU-a": 4}, health=False),
        ],
        annotations={"hami.io/device-cordon": "GPU-a,GPU-b"},
    )
    assert all(type(device) is Card for device in node.cards)


@pytest.mark.parametrize(("reported", "own"), [
    pytest.param({}, (15360, 100), id="unscaled"),
    pytest.param({"memory": 30720, "physical_memory": 15360}, (15360, 100), id="memory-x2"),
    pytest.param({"cores": 200, "physical_cores": 100}, (15360, 100), id="cores-x2"),
    pytest.param({"memory": 27648, "physical_memory": 15360, "cores": 50,
                  "physical_cores": 100}, (15360, 100), id="both"),
])
def test_the_core_card_keeps_the_physical_figures_beside_the_registered(
        reported: dict[str, int], own: tuple[int, int]) -> None:
    """The registered figures decide; the card's own travel with them for the reports."""
    fields: dict[str, object] = {"uuid": "GPU-a", "index": 0, "type": "NVIDIA-Tesla T4",
                                 "memory": 15360, **reported}
    card = msgspec.convert(fields, ReportedCard)
    decoded = decode_inventory(encode(_inventory([card])))
    (device,) = decoded.to_node().cards
    assert type(device) is Card
    assert (device.memory, device.cores) == (card.memory, card.cores)
    assert (device.own_memory, device.own_cores) == own
    assert (device.physical_memory, device.physical_cores) == (
        reported.get("physical_memory"), reported.get("physical_cores"))


def test_to_node_without_cordons_has_no_annotation() -> None:
    assert _inventory(CARDS).to_node().annotations == {}


def test_unknown_topology_stays_unknown_and_no_nvlink_stays_empty() -> None:
    unknown = ReportedCard(uuid="GPU-c", index=2, type="NVIDIA-Tesla T4", memory=15360)
    devices = _inventory([CARDS[0], unknown]).to_node().cards
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


def _refusal(document: dict[str, object], subject: str | None = None) -> WireError:
    with pytest.raises(WireError) as raised:
        decode_inventory(msgspec.msgpack.encode(document), subject)
    return raised.value


@pytest.mark.parametrize(("field", "value", "path"), [
    ("memory", 2**63, "$.cards[0].memory"),
    ("memory", 2**24 + 1, "$.cards[0].memory"),
    ("cores", 2**16 + 1, "$.cards[0].cores"),
    ("count", 2**16 + 1, "$.cards[0].count"),
    ("index", -1, "$.cards[0].index"),
    ("numa", -2, "$.cards[0].numa"),
    ("processes", 2**32, "$.cards[0].processes"),
    ("links", {"GPU-b": 2**31}, "$.cards[0].links[...]"),
    ("links", {"G" * 129: 1}, "key` in `$.cards[0].links"),
    ("uuid", "GPU-a:0", "$.cards[0].uuid"),
    ("uuid", "G" * 129, "$.cards[0].uuid"),
    ("uuid", "", "$.cards[0].uuid"),
    ("type", "T" * 129, "$.cards[0].type"),
])
def test_a_card_field_beyond_its_bound_is_refused_naming_the_field(
        field: str, value: object, path: str) -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"][0][field] = value
    error = _refusal(document)
    assert error.result == "rejected"
    assert path in str(error)


@pytest.mark.parametrize("uuid", ["GPU b", "GPU-b,1", "GPU-\u00e9", "GPU-b\n"])
def test_a_card_uuid_outside_its_characters_is_refused_naming_the_card(uuid: str) -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"][1]["uuid"] = uuid
    error = _refusal(document)
    assert error.result == "rejected"
    assert str(error) == ("malformed inventory message: Expected `str` matching regex "
                          "'^[A-Za-z0-9._/-]+$' - at `$.cards[1].uuid`")


def test_a_node_of_more_than_256_cards_or_cordons_is_refused() -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"] = [dict(document["cards"][0], uuid=f"GPU-{i}", index=i)
                         for i in range(257)]
    assert "length <= 256 - at `$.cards`" in str(_refusal(document))
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cordoned"] = ["GPU-a"] * 257
    assert "length <= 256 - at `$.cordoned`" in str(_refusal(document))


@pytest.mark.parametrize(("node", "problem"), [
    ("n" * 5000, "node: 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'... (5000 characters) is longer "
                 "than 253 characters"),
    ("Node A", "node: 'Node A' is not a valid DNS-1123 subdomain"),
    ("", "node: must not be empty"),
])
def test_an_inventory_node_name_must_be_a_kubernetes_node_name(node: str, problem: str) -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["node"] = node
    assert problem in str(_refusal(document))


def test_an_inventory_must_come_on_its_own_nodes_subject() -> None:
    data = encode(_inventory(CARDS))
    assert decode_inventory(data, inventory_subject("node-a")).node == "node-a"
    with pytest.raises(WireError, match=re.escape(
            "node 'node-a' arrived on subject 'pyhami.inventory.node-b'")) as raised:
        decode_inventory(data, inventory_subject("node-b"))
    assert raised.value.result == "wrong_subject"


@pytest.mark.parametrize(("second", "problem"), [
    ({"uuid": "GPU-a", "index": 1}, "card uuid 'GPU-a' is listed twice"),
    ({"uuid": "GPU-b", "index": 0}, "card index 0 is listed twice"),
])
def test_a_card_listed_twice_in_one_inventory_is_refused(second: dict[str, object],
                                                         problem: str) -> None:
    document = msgspec.to_builtins(_inventory(CARDS))
    document["cards"][1].update(second)
    assert problem in str(_refusal(document))


def test_allocation_messages_survive_encoding_and_name_their_subjects() -> None:
    pending = PendingAllocations(node="gpu-node-1", pods=[PendingPod(
        namespace="default", name="a", uid="u-1", devices="GPU-a,NVIDIA,1000,0:;",
        bind_time=1700000000)], holding=[HoldingPod(namespace="default", name="b", uid="u-2")])
    assert decode_pending(encode(pending)) == pending
    outcome = AllocationOutcome(namespace="default", name="a", uid="u-1", ok=False,
                                reason="no such card")
    assert decode_outcome(encode(outcome)) == outcome
    assert allocations_subject("gpu.node-1") == "pyhami.allocations.gpu.node-1"
    assert allocated_subject("gpu.node-1") == "pyhami.allocated.gpu.node-1"
    assert subject_node_checked("pyhami.allocated.gpu.node-1",
                                ALLOCATED_SUBJECT_PREFIX) == "gpu.node-1"


@pytest.mark.parametrize(("subject", "message"), [
    ("pyhami.allocated.Bad_Node", "subject 'pyhami.allocated.Bad_Node': node: 'Bad_Node' "
                                  "is not a valid DNS-1123 subdomain"),
    ("pyhami.inventory.node-a", "subject 'pyhami.inventory.node-a' is not under "
                                "pyhami.allocated"),
])
def test_an_allocation_subject_must_name_a_valid_node(subject: str, message: str) -> None:
    with pytest.raises(WireError, match=re.escape(message)):
        subject_node_checked(subject, ALLOCATED_SUBJECT_PREFIX)


def test_allocation_messages_with_bad_names_or_fields_are_refused() -> None:
    bad_node = PendingAllocations(node="Node_A", pods=[])
    with pytest.raises(WireError, match="node: 'Node_A' is not a valid DNS-1123 subdomain"):
        decode_pending(encode(bad_node))
    bad_pod = PendingAllocations(node="node-a", pods=[PendingPod(
        namespace="default", name="A", uid="u", devices="", bind_time=0)])
    with pytest.raises(WireError, match="pending allocations refused: name: 'A'"):
        decode_pending(encode(bad_pod))
    bad_holder = PendingAllocations(node="node-a", pods=[], holding=[HoldingPod(
        namespace="default", name="B", uid="u")])
    with pytest.raises(WireError, match="pending allocations refused: name: 'B'"):
        decode_pending(encode(bad_holder))
    refused = "allocation outcome refused: namespace: 'kube.system'"
    with pytest.raises(WireError, match=re.escape(refused)):
        decode_outcome(encode(AllocationOutcome(namespace="kube.system", name="a", uid="u",
                                                ok=True)))
    long_uid = msgspec.msgpack.encode({"namespace": "default", "name": "a", "uid": "u" * 129,
                                       "ok": True})
    with pytest.raises(WireError, match=r"malformed allocation outcome: .*\$\.uid"):
        decode_outcome(long_uid)
    with pytest.raises(WireError, match=r"malformed allocation outcome: .*\$\.reason"):
        decode_outcome(msgspec.msgpack.encode({"namespace": "default", "name": "a",
                                               "uid": "u", "ok": True, "reason": "x" * 1025}))
    with pytest.raises(WireError, match="malformed pending allocations"):
        decode_pending(b"\xc1")


_INT64 = st.integers(-(2**63), 2**63 - 1)
_runtime_fields = st.fixed_dictionaries({}, optional={
    "container_index": st.one_of(st.integers(-2, 3), _INT64, st.text(max_size=3)),
    "device_index": st.one_of(st.integers(-2, 3), _INT64),
    "mig_uuid": st.one_of(st.just("MIG-1"), st.text(max_size=12), st.just("x" * 200)),
    "gpu_instance_id": st.one_of(st.integers(-1, 14), _INT64, st.none()),
    "compute_instance_id": st.one_of(st.integers(-1, 3), st.floats()),
})


@settings(max_examples=200, deadline=None)
@given(instances=st.one_of(st.lists(_runtime_fields, max_size=4), st.text(max_size=8),
                           _INT64))
def test_fuzzed_mig_runtime_in_an_outcome_is_read_whole_or_refused(instances: object) -> None:
    raw = msgspec.msgpack.encode({"namespace": "default", "name": "a", "uid": "u",
                                  "ok": True, "mig_instances": instances})
    try:
        outcome = decode_outcome(raw)
    except WireError as error:
        assert "\n" not in str(error)
        assert str(error).startswith(("malformed allocation outcome", "allocation outcome"))
        return
    for made in outcome.mig_instances:
        assert made.mig_uuid and made.container_index >= 0 and made.device_index >= 0
        assert made.gpu_instance_id >= 0 and made.compute_instance_id >= 0
