"""The agent's pure state: what changed, what is still unpublished, how messages are numbered."""

from __future__ import annotations

import msgspec

from agent.report import Report, describe_changes
from agent.vendors.nvidia.simulated import profile_cards
from common.wire import SCHEMA_VERSION


def _report() -> Report:
    return Report("gpu-node-1", "instance-1", 10.0, cordoned=["GPU-gpu-node-1-3"],
                  version="9.9.9")


def test_a_message_carries_the_latest_observation_and_the_agent_identity() -> None:
    report = _report()
    cards = profile_cards("t4x4", "gpu-node-1")
    report.observe(cards)
    message = report.message("start", 1700000000.0)
    assert (message.schema, message.node, message.agent_version, message.instance) == (
        SCHEMA_VERSION, "gpu-node-1", "9.9.9", "instance-1")
    assert (message.sequence, message.reason, message.timestamp) == (1, "start", 1700000000.0)
    assert message.cards == cards
    assert message.cordoned == ["GPU-gpu-node-1-3"]
    assert message.heartbeat_interval == 10.0


def test_the_sequence_advances_only_for_messages_that_went_out() -> None:
    report = _report()
    report.observe(profile_cards("t4x4", "gpu-node-1"))
    first = report.message("start", 1.0)
    assert report.message("start", 1.0).sequence == first.sequence == 1
    report.confirm(first)
    assert report.message("heartbeat", 2.0).sequence == 2


def test_a_change_stays_unpublished_until_a_message_with_it_is_confirmed() -> None:
    report = _report()
    cards = profile_cards("t4x4", "gpu-node-1")
    report.observe(cards)
    assert report.unpublished
    report.confirm(report.message("start", 1.0))
    assert not report.unpublished
    busy = [msgspec.structs.replace(cards[0], processes=1), *cards[1:]]
    assert report.observe(busy) == ["GPU-gpu-node-1-0: processes 0 -> 1"]
    assert report.unpublished
    report.message("change", 2.0)  # built but never sent
    assert report.unpublished
    assert report.observe(busy) == []


def test_changes_name_the_card_and_the_field() -> None:
    before = profile_cards("t4x4", "n")
    after = [msgspec.structs.replace(before[1], health=False, health_detail="critical XID 79"),
             *before[2:]]
    assert describe_changes(before, after) == [
        "GPU-n-0: removed",
        "GPU-n-1: health True -> False",
        "GPU-n-1: health_detail '' -> 'critical XID 79'",
    ]
    assert describe_changes(after, before)[0] == "GPU-n-0: added"


def test_cordons_naming_no_observed_card_are_found() -> None:
    report = Report("n", "i", 10.0, cordoned=["GPU-n-1", "GPU-elsewhere-0"])
    report.observe(profile_cards("t4x4", "n"))
    assert report.unknown_cordons() == ["GPU-elsewhere-0"]
