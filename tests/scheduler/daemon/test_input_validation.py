"""Issue 9, "validate at the door": input a Kubernetes API server or an honest agent
would never send is refused by name (4xx, or a counted inventory refusal), and the
daemon goes on scheduling.

Each test is named by the behaviour it protects; the issue's item is in its docstring.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from common.core import Fleet, Node, decide, parse_pod
from common.core.annotations import ALLOCATED_ANNOTATION
from common.core.model import CARD_COUNT_MAX, CARD_MEMORY_MAX_MIB, CARDS_PER_NODE_MAX, Card
from common.core.names import InvalidName, check_label, check_subdomain
from common.files import InputFileError, parse_pod_manifest
from common.wire import SCHEMA_VERSION, Inventory, ReportedCard, encode, inventory_subject
from pyhami.demo import lab_pod
from pyhami.sandbox import DEFAULTS
from scheduler.cluster import ClusterPod, PodChange
from scheduler.cluster.standalone._wire import pod_key
from scheduler.service import NodeScore, SchedulerService, ServiceSettings
from scheduler.web.limits import EXTENDER_BODY_LIMIT, POD_BODY_LIMIT
from tests.builders import manifest
from tests.fakes.node_list import NodeList, inventory_message, silent
from tests.harness import Lab, eventually, inventory_count

NODE = "gpu-node-1"  # the lab's simulated node: four T4s, GPU-gpu-node-1-0..3

# Kubernetes' own patterns, as hypothesis strategies.
LABELS = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
SUBDOMAINS = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}\Z")


# Helpers ----------------------------------------------------------------------------------


@pytest.fixture
async def bus(lab: Lab) -> AsyncIterator[Client]:
    """A client of the lab's nats-server, playing a faulty or hostile agent."""
    client = await nats.connect(lab.nats.url)
    yield client
    await client.close()


def service(lab: Lab) -> SchedulerService:
    assert lab.daemon.service is not None
    return lab.daemon.service


def refused(lab: Lab, result: str) -> float:
    return inventory_count(service(lab), result) or 0.0


async def until_refused(lab: Lab, result: str, count: float = 1.0) -> None:
    async def counted() -> bool:
        return refused(lab, result) >= count

    await eventually(counted, f"{count:g} inventory messages counted as {result}")


def inventory(node: str, cards: list[ReportedCard]) -> Inventory:
    return Inventory(schema=SCHEMA_VERSION, node=node, agent_version="test", instance="x",
                     sequence=1, timestamp=time.time(), reason="start", heartbeat_interval=10.0,
                     cards=cards)


def t4(uuid: str, index: int, memory: int = 15360) -> ReportedCard:
    return ReportedCard(uuid=uuid, index=index, type="NVIDIA-Tesla T4", memory=memory, numa=0,
                        links={})


async def post(lab: Lab, path: str, **kwargs: Any) -> tuple[int, str]:
    async with lab.pods.session.post(f"{lab.daemon.url}{path}", **kwargs) as response:
        return response.status, await response.text()


async def filter_on_the_lab_node(lab: Lab, pod: dict[str, Any]) -> dict[str, Any]:
    status, text = await post(lab, "/filter", json={"Pod": pod, "NodeNames": [NODE]})
    assert status == 200, text
    result: dict[str, Any] = msgspec.json.decode(text)
    return result


# Item 1 (inventory half) -------------------------------------------------------------------


async def test_an_inventory_naming_a_5000_character_node_is_refused_and_filter_keeps_working(
        lab: Lab, bus: Client) -> None:
    """Item 1: such a node name once reached a NATS subject and cut the daemon off NATS."""
    await bus.publish(inventory_subject("intruder"),
                      encode(inventory("n" * 5000, [t4("GPU-intruder-0", 0)])))
    await bus.flush()
    await until_refused(lab, "rejected")
    assert [n.name for n in service(lab).state.fleet.nodes()] == [NODE]
    assert (await filter_on_the_lab_node(lab, lab_pod("after")))["NodeNames"] == [NODE]
    # The daemon still talks to NATS: the pod store (JetStream) takes the pod and its binding.
    await lab.pods.submit_and_place(lab_pod("placed"))


async def test_an_inventory_on_another_nodes_subject_is_refused(lab: Lab, bus: Client) -> None:
    """Item 1: the node in a message must be the node of the subject it came on."""
    await bus.publish(inventory_subject(NODE),
                      encode(inventory("gpu-node-2", [t4("GPU-gpu-node-2-0", 0)])))
    await bus.flush()
    await until_refused(lab, "wrong_subject")
    assert service(lab).state.fleet.node("gpu-node-2") is None


async def test_refused_inventories_are_each_counted_but_logged_at_a_bounded_rate(
        lab: Lab, bus: Client, caplog: pytest.LogCaptureFixture) -> None:
    """Items 1 and 2: a flood of bad messages costs a counter each, not a log line each."""
    caplog.set_level(logging.WARNING, logger="scheduler.service")
    bad = encode(inventory("gpu-node-2", [t4("GPU-gpu-node-2-0", 0, memory=2**63)]))
    for _ in range(50):
        await bus.publish(inventory_subject("gpu-node-2"), bad)
    await bus.flush()
    await until_refused(lab, "rejected", 50)
    lines = [r.getMessage() for r in caplog.records if "inventory" in r.getMessage()]
    assert len(lines) == 1
    assert "Expected `int` <= 16777216 - at `$.cards[0].memory`" in lines[0]


# Item 2 -------------------------------------------------------------------------------------


async def test_a_card_memory_of_2_to_the_63_is_refused_and_every_node_still_schedules(
        lab: Lab, bus: Client) -> None:
    """Item 2: numpy overflowed on it, and every /filter and /metrics answered 500."""
    await bus.publish(inventory_subject("gpu-node-2"), encode(inventory(
        "gpu-node-2", [t4("GPU-gpu-node-2-0", 0, memory=2**63)])))
    await bus.flush()
    await until_refused(lab, "rejected")
    assert service(lab).state.fleet.node("gpu-node-2") is None
    assert "hami_gpu_memory_limit_bytes" in service(lab).metrics.exposition().decode()
    status, text = await post(lab, "/filter", json={
        "Pod": lab_pod("p"), "NodeNames": [NODE, "gpu-node-2"]})
    assert status == 200, text
    assert msgspec.json.decode(text)["NodeNames"] == [NODE]
    await lab.pods.submit_and_place(lab_pod("placed"))


def test_cards_at_every_bound_keep_the_decision_finite() -> None:
    """Item 2: the bounds are chosen so no sum leaves int64 and no score is infinite."""
    fleet = Fleet()
    for name in ("a", "b"):
        fleet.upsert_node(Node(name=name, cards=[
            Card(uuid=f"GPU-{name}-{i}", index=i, type="T", memory=CARD_MEMORY_MAX_MIB,
                 cores=CARD_COUNT_MAX, count=CARD_COUNT_MAX, numa=CARD_COUNT_MAX,
                 processes=CARD_COUNT_MAX - 1, links={f"GPU-{name}-0": CARD_COUNT_MAX})
            for i in range(CARDS_PER_NODE_MAX)]))
    request = parse_pod(manifest(gpus=CARDS_PER_NODE_MAX, gpumem=CARD_MEMORY_MAX_MIB), DEFAULTS)
    decision = decide(fleet, request, explain=True)
    assert decision.node == "a"
    assert decision.explain is not None
    assert all(0 <= row.score < float("inf") for row in decision.explain)


@pytest.mark.parametrize("grant", [
    "GPU-n-0,NVIDIA,99999999999999999999,0:;",  # once an int64 overflow in every score
    "GPU-n-0,NVIDIA," + "9" * 5000 + ",0:;",  # once a ValueError out of int()
    "GPU-n-0,NVIDIA,1000,²:;",
])
async def test_an_allocation_annotation_beyond_the_bounds_is_not_counted_and_scoring_goes_on(
        grant: str, caplog: pytest.LogCaptureFixture) -> None:
    """Item 2: anyone who may create a pod may write the annotation the ledger is rebuilt
    from; a number in it must not overflow the ledger's sums."""
    service = SchedulerService(ServiceSettings(DEFAULTS), NodeList(set()), silent)
    service.handlers.inventories.ingest(*inventory_message("n", 1))
    crafted = ClusterPod(manifest=manifest("crafted"), uid="u",  # asks for a GPU: decoded
                         node="n", phase="Running", annotations={ALLOCATED_ANNOTATION: grant})
    await service.handlers.pods.on_pod_change(PodChange(crafted, deleted=False))
    assert service.state.fleet.allocation("default/crafted") is None
    assert "hami.io/vgpu-devices-allocated: card 'GPU-n-0,NVIDIA," in caplog.text
    scores = await service.verbs.prioritize(manifest(), ["n"])
    assert scores == [NodeScore("n", 0)]


# Item 5 -------------------------------------------------------------------------------------


async def test_a_card_listed_twice_or_claimed_from_a_live_node_is_never_given_twice(
        lab: Lab, bus: Client) -> None:
    """Item 5: a node listing one UUID twice gave a 2-card pod the same card twice."""
    twice = [t4("GPU-twice", 0), t4("GPU-twice", 1)]
    await bus.publish(inventory_subject("gpu-node-2"), encode(inventory("gpu-node-2", twice)))
    claimed = [t4(f"GPU-{NODE}-0", 0), t4("GPU-gpu-node-3-1", 1)]
    await bus.publish(inventory_subject("gpu-node-3"), encode(inventory("gpu-node-3", claimed)))
    await bus.flush()
    await until_refused(lab, "rejected")
    await until_refused(lab, "card_conflict")
    assert [n.name for n in service(lab).state.fleet.nodes()] == [NODE]

    allocated = await lab.pods.submit_and_place(lab_pod("pair", {
        "hami.io/gpu-scheduler-policy": "binpack"}, limits={"nvidia.com/gpu": 2}))
    cards = [grant.split(",")[0] for grant in allocated.rstrip(";").split(":") if grant]
    assert len(cards) == len(set(cards)) == 2
    assert all(card.startswith(f"GPU-{NODE}-") for card in cards)


# Item 7 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("quantity", "problem"), [
    ("1e10000000", "'1e10000000' is above 2^53"),
    ("9" * 5000, "a quantity of 5000 characters is not accepted"),
])
async def test_a_quantity_that_once_blocked_the_loop_is_refused_at_once_by_name(
        lab: Lab, quantity: str, problem: str) -> None:
    """Item 7: "1e10000000" (157 bytes) blocked the event loop 5.9 s; 5,000 digits gave 500."""
    started = time.perf_counter()
    result = await filter_on_the_lab_node(lab, lab_pod("q", limits={
        "nvidia.com/gpumem": quantity}))  # type: ignore[dict-item]
    assert time.perf_counter() - started < 1.0
    reason = result["FailedAndUnresolvableNodes"][NODE]
    assert reason.startswith("PodRejected: spec.containers[0].resources.limits"
                             "[nvidia.com/gpumem]: ")
    assert problem in reason


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": '
     b'{"nvidia.com/gpu": ' + b"9" * 5000 + b"}}}]}}}",
     "Integer value out of range - at `$.Pod.spec.containers[0].resources.limits[...]`"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "Extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "JSON nested too deeply"),
    (b'{"Pod": {"metadata": {"name": "p", "annotations": ' + b"[" * 100_000 + b"}}}",
     "at `$.Pod.metadata.annotations`"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": 5}]}}',
     "Nodes.items[0]: Expected `object`, got `int` - at `$.metadata`"),
    (msgspec.json.encode({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n"] * 65_537}),
     "Expected `array` of length <= 65536 - at `$.NodeNames`"),
])
async def test_numbers_and_nesting_beyond_bounds_are_a_400_naming_the_problem(
        lab: Lab, body: bytes, problem: str) -> None:
    """Item 7: 5,000-digit numbers and 100,000-deep nesting answered 500; 790,000 unknown
    node names (8 MiB) made a 53 MB answer."""
    for verb in ("filter", "prioritize"):
        status, text = await post(lab, f"/{verb}", data=body)
        assert status == 400, text
        assert text.startswith("malformed ExtenderArgs: ")
        assert problem in text


async def test_the_largest_body_kube_scheduler_sends_at_15000_nodes_is_served(lab: Lab) -> None:
    """Item 7: the limit still serves 15,000 node names of 253 characters and a big pod."""
    pod = lab_pod("big", limits={"cpu": 1})  # no GPU: /filter passes every node through
    pod["metadata"]["annotations"] = {"example.com/blob": "x" * 1_500_000}
    names = [f"{i:05d}".ljust(253, "n") for i in range(15_000)]
    body = msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": names})
    assert len(body) > 5_000_000
    status, text = await post(lab, "/filter", data=body)
    assert status == 200
    assert len(msgspec.json.decode(text)["NodeNames"]) == 15_000


async def test_a_body_over_the_limit_is_413_before_it_is_read_whole(lab: Lab) -> None:
    """Item 7: a 57 MB /filter body blocked the daemon 19 s and grew it to 1.1 GB."""
    oversized = b" " * (EXTENDER_BODY_LIMIT + 1)
    status, text = await post(lab, "/filter", data=oversized)  # with a Content-Length
    assert status == 413
    assert f"Maximum request body size {EXTENDER_BODY_LIMIT} exceeded" in text

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to judge by
        for _ in range(64):
            yield b" " * (EXTENDER_BODY_LIMIT // 32)

    status, text = await post(lab, "/filter", data=chunks())
    assert status == 413
    # The daemon goes on answering.
    assert (await filter_on_the_lab_node(lab, lab_pod("after")))["NodeNames"] == [NODE]


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("PodName", "Bad Name", "PodName: 'Bad Name' is not a valid DNS-1123 subdomain"),
    ("PodName", "p" * 4100, "PodName: 'pppppppppppppppppppppppppppppppppppppppp'... "
                            "(4100 characters) is longer than 253 characters"),
    ("PodNamespace", "a.b", "PodNamespace: 'a.b' is not a valid DNS-1123 label"),
    ("Node", "", "Node: must not be empty"),
])
async def test_bind_args_with_names_kubernetes_refuses_are_a_400_naming_the_field(
        lab: Lab, field: str, value: str, problem: str) -> None:
    """Items 7 and 8: every malformed body is a 400 naming what is wrong, /bind too."""
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": NODE}
    status, text = await post(lab, "/bind", json={**args, field: value})
    assert status == 400
    assert text.startswith(f"malformed ExtenderBindingArgs: {problem}")


async def test_a_filtered_pod_with_a_name_kubernetes_refuses_is_a_400(lab: Lab) -> None:
    pod = lab_pod("p")
    pod["metadata"]["namespace"] = "Team A"
    status, text = await post(lab, "/filter", json={"Pod": pod, "NodeNames": [NODE]})
    assert status == 400
    assert "Pod.metadata.namespace: 'Team A' is not a valid DNS-1123 label" in text


# Item 8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("metadata", "problem"), [
    ({"name": "my pod"}, "metadata.name: 'my pod' is not a valid DNS-1123 subdomain"),
    ({"name": "pöd"}, "metadata.name: 'pöd' is not a valid DNS-1123 subdomain"),
    ({"name": "p", "namespace": "équipe"}, "metadata.namespace: 'équipe' is not a valid"),
    ({"name": "x", "namespace": "a.b"}, "metadata.namespace: 'a.b' is not a valid DNS-1123"),
    ({"namespace": "default"}, "metadata.name: must not be empty"),
])
async def test_pod_api_names_kubernetes_refuses_are_a_400_naming_the_field(
        lab: Lab, metadata: dict[str, str], problem: str) -> None:
    """Item 8: names with spaces or non-ASCII characters answered 500."""
    status, text = await post(lab, "/api/pods", json={"metadata": metadata})
    assert status == 400
    assert text.startswith(f"request body: {problem}")


async def test_a_4100_character_pod_name_is_a_400_and_the_daemon_stays_on_nats(lab: Lab) -> None:
    """Item 1 (pod API half): its store key was longer than nats-server accepts, and the
    daemon's connection closed for good."""
    status, text = await post(lab, "/api/pods", json=lab_pod("p" * 4100))
    assert status == 400
    assert "metadata.name: 'pppp" in text
    assert "(4100 characters) is longer than 253 characters" in text
    await lab.pods.submit_and_place(lab_pod("after"))


@pytest.mark.parametrize("body", [
    b'{"metadata": {"name": "huge"}, "spec": {"containers": [{"resources": '
    b'{"limits": {"cpu": 1180591620717411303424}}}]}}',
    b"metadata: {name: huge}\nspec: {containers: [{resources: "
    b"{limits: {cpu: 1180591620717411303424}}}]}\n",
])
async def test_a_whole_number_too_large_to_store_is_a_400_not_a_500(lab: Lab,
                                                                     body: bytes) -> None:
    """A cpu of 2^70 passed the door and failed when the pod was stored (msgpack's range)."""
    status, text = await post(lab, "/api/pods", data=body)
    assert status == 400, text
    assert "spec.containers[0].resources.limits" in text
    assert await lab.pods.pods() == []
    await lab.pods.submit_and_place(lab_pod("after"))


@pytest.mark.parametrize("path", ["/api/pods/default/my%20pod", "/api/pods/a.b/x"])
async def test_pod_api_paths_with_names_kubernetes_refuses_are_a_400(lab: Lab, path: str) -> None:
    for method in ("GET", "DELETE"):
        async with lab.pods.session.request(method, f"{lab.daemon.url}{path}") as response:
            assert response.status == 400
            assert "is not a valid DNS-1123" in await response.text()


async def test_pods_a_dot_b_slash_x_and_a_slash_b_dot_x_can_no_longer_collide(lab: Lab) -> None:
    """Item 8: both had one store key, so deleting one removed the other."""
    pod = lab_pod("b.x", limits={"cpu": 1})
    pod["metadata"]["namespace"] = "a"
    await lab.pods.submit(pod)
    other = lab_pod("x", limits={"cpu": 1})
    other["metadata"]["namespace"] = "a.b"
    status, _ = await post(lab, "/api/pods", json=other)
    assert status == 400
    other["metadata"]["namespace"] = "a-b"
    await lab.pods.submit(other)
    await lab.pods.delete("x", "a-b")
    assert (await lab.pods.get("b.x", "a"))["name"] == "b.x"


@given(LABELS, SUBDOMAINS, LABELS, SUBDOMAINS)
def test_valid_names_give_distinct_store_keys(namespace: str, name: str, other_namespace: str,
                                              other_name: str) -> None:
    """Item 8: with names as Kubernetes allows them, one key is one pod."""
    for value, check in ((namespace, check_label), (other_namespace, check_label),
                         (name, check_subdomain), (other_name, check_subdomain)):
        check("field", value)
    same_key = pod_key(namespace, name) == pod_key(other_namespace, other_name)
    assert same_key == ((namespace, name) == (other_namespace, other_name))


LAUGHS = "metadata:\n  name: lol\n  labels: &a {a: b}\n  annotations: *a\n"


@pytest.mark.parametrize(("path", "body", "status", "problem"), [
    ("/api/pods", LAUGHS, 400, "YAML aliases (*name) are not accepted"),
    ("/explain", LAUGHS, 400, "YAML aliases (*name) are not accepted"),
    ("/api/pods", "metadata: " + "[" * 5_000, 400, "exceeded maximum nesting depth"),
    ("/explain", "metadata: " + "{a: " * 3_000, 400, "exceeded maximum nesting depth"),
    ("/api/pods", "metadata: " + "[" * 100_000, 400, "read as YAML here: send it as JSON"),
    ("/api/pods", "spec: {containers: [{resources: {limits: {nvidia.com/gpu: "
     + "9" * 5000 + "}}}]}", 400, "a value cannot be read"),
    ("/api/pods", "#" * (POD_BODY_LIMIT + 1), 413,
     f"Maximum request body size {POD_BODY_LIMIT} exceeded"),
    ("/explain", "#" * (POD_BODY_LIMIT + 1), 413,
     f"Maximum request body size {POD_BODY_LIMIT} exceeded"),
])
async def test_pod_manifest_bodies_are_bounded_in_size_depth_and_aliases(
        lab: Lab, path: str, body: str, status: int, problem: str) -> None:
    """Items 7 and 8: a few bytes of YAML aliases stand for billions of nodes."""
    answered, text = await post(lab, path, data=body.encode(),
                                headers={"Content-Type": "application/yaml"})
    assert answered == status, text
    assert problem in text


def test_names_follow_kubernetes_dns_1123_rules() -> None:
    check_label("namespace", "a" * 63)
    check_subdomain("name", ".".join(["a" * 63] * 4)[:253])
    for value, check, problem in [
        ("a" * 64, check_label, "is longer than 63 characters (a DNS-1123 label)"),
        ("a.b", check_label, "is not a valid DNS-1123 label"),
        ("-a", check_label, "is not a valid DNS-1123 label"),
        ("a" * 254, check_subdomain, "is longer than 253 characters (a DNS-1123 subdomain)"),
        ("a..b", check_subdomain, "is not a valid DNS-1123 subdomain"),
        ("a.-b", check_subdomain, "is not a valid DNS-1123 subdomain"),
        ("A", check_subdomain, "is not a valid DNS-1123 subdomain"),
    ]:
        with pytest.raises(InvalidName, match=re.escape(problem)):
            check("field", value)


async def test_explain_still_reads_a_pod_without_a_name(lab: Lab) -> None:
    """/explain books nothing and keys nothing by name: a manifest file without one is fine."""
    status, text = await post(lab, "/explain", data=b"spec: {containers: [{resources: "
                              b"{limits: {nvidia.com/gpu: 1}}}]}")
    assert status == 200, text
    assert msgspec.json.decode(text)["node"] == NODE


def test_a_json_manifest_is_read_by_msgspec_and_yaml_flow_style_still_works() -> None:
    """Item 7: a 1.3 MB manifest blocked the loop 1.6 s in PyYAML; JSON takes a millisecond."""
    env = [{"name": f"VAR_{i}", "value": "x" * 60} for i in range(15_000)]
    pod = {"kind": "Pod", "metadata": {"name": "big"},
           "spec": {"containers": [{"env": env, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    text = msgspec.json.encode(pod)
    started = time.perf_counter()
    assert parse_pod_manifest(text, "body").metadata.name == "big"
    assert time.perf_counter() - started < 0.1
    assert parse_pod_manifest("{metadata: {name: flow}}", "body").metadata.name == "flow"
    with pytest.raises(InputFileError, match=re.escape("body: kind is 'Node', expected 'Pod'")):
        parse_pod_manifest(b'{"kind": "Node"}', "body")
