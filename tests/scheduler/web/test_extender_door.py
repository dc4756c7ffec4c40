"""The extender's door without a daemon around it: each body decoded once, the service's
verb called with a pod and node names, its answer written in kube-scheduler's shape; a
standby refused by the verbs' own check before any body is read."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from pyhami.sandbox import DEFAULTS
from scheduler.leadership import AlwaysLeader
from scheduler.service import SchedulerService, ServiceSettings
from scheduler.web.extender import TEXT, Answer, extender_verbs
from tests.builders import manifest
from tests.fakes.node_list import NodeList, inventory_message, silent

POD = msgspec.to_builtins(manifest("p"))
PLAIN_POD = msgspec.to_builtins(manifest("plain", gpus=None, gpumem=None))


class Standby(AlwaysLeader):
    """A daemon that may not decide: another holds the lease."""

    def leading(self) -> bool:
        return False

    def refusal(self) -> str | None:
        return "standby: daemon-b holds the lease"


async def service(leadership: AlwaysLeader | None = None) -> SchedulerService:
    built = SchedulerService(ServiceSettings(DEFAULTS), NodeList({"n1", "n2"}), silent,
                             leadership=leadership)
    built.shared.ready = True
    for node in ("n1", "n2"):
        await built.handlers.inventories.receive_inventory(*inventory_message(node, 1))
    return built


async def post(built: SchedulerService, verb: str, body: bytes) -> Answer:
    return await extender_verbs(built)[f"/{verb}"](body)


def answered(answer: Answer) -> Any:
    assert answer.status == 200, answer
    return json.loads(answer.body)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
@pytest.mark.parametrize("body", [b"{}", b"not json"], ids=["empty", "malformed"])
async def test_a_standby_answers_503_naming_the_holder_before_reading_the_body(
        verb: str, body: bytes) -> None:
    built = await service(Standby("daemon-a"))
    assert await post(built, verb, body) == Answer(
        503, TEXT, b"standby: daemon-b holds the lease\n")


async def test_a_standby_s_filter_called_directly_decides_nothing() -> None:
    """The pending loop is not behind the door: the verb refuses itself."""
    built = await service(Standby("daemon-a"))
    for pod in (manifest("p"), manifest("plain", gpus=None, gpumem=None)):
        filtered = await built.verbs.filter(pod, ("n1", "n2"))
        assert (filtered.passing, filtered.error) == (None, "standby: daemon-b holds the lease")
    assert built.state.cache.reservation("default/p") is None


async def test_nodes_sent_as_objects_are_answered_as_objects_of_the_nodes_that_pass() -> None:
    built = await service()
    nodes = [{"metadata": {"name": name}, "status": {"extra": name}}
             for name in ("n1", "n2", "nx")]
    body = json.dumps({"Pod": POD, "Nodes": {"items": nodes}}).encode()
    result = answered(await post(built, "filter", body))
    assert (result["NodeNames"], result["Nodes"]) == (None, {"items": [nodes[0]]})
    assert set(result["FailedNodes"]) == {"nx"}
    plain = json.dumps({"Pod": PLAIN_POD, "Nodes": {"items": nodes}}).encode()
    assert answered(await post(built, "filter", plain))["Nodes"] == {"items": nodes}


async def test_prioritize_scores_every_name_sent_in_order() -> None:
    built = await service()
    body = json.dumps({"Pod": POD, "NodeNames": ["n2", "nx", "n2"]}).encode()
    assert answered(await post(built, "prioritize", body)) == [
        {"Host": "n2", "Score": 0}, {"Host": "nx", "Score": 0}, {"Host": "n2", "Score": 0}]
