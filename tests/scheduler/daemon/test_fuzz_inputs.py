"""Fuzzing every door of the standalone daemon: no input may cause a server error, a crash,
or break an invariant (docs/reliability.md).

Targets: extender bodies (/filter, /prioritize, /bind, /preempt), pod manifests (POST /api/pods,
YAML and JSON), pod-API paths (GET/DELETE /api/pods/{ns}/{name}), ResourceQuota bodies and
paths (/api/resourcequotas), and inventory messages on NATS. Each target runs against a
fresh, real standalone stack (``tests.fuzzing``): first the issue's known hostile inputs,
then hypothesis-generated ones in batches. After every batch: no answer >= 500 and none
missing, /healthz, /readyz and /metrics answer 200, a normal pod is still scheduled, a pod
asking no GPU is not stuck in BindingFailed, nothing was logged with a traceback, and the
invariants of ``tests.invariants`` hold.

CI runs ``CI_EXAMPLES_PER_TARGET`` generated inputs per target; ``PYHAMI_FUZZ_EXAMPLES=N``
runs N per target (``scripts/fuzz-long.sh`` runs a campaign of >= 100,000 inputs).
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common.core import PodManifest
from common.core.pod import QuotaSubject
from common.core.quota import Quota, ResourceQuotaManifest, parse_quota
from tests.fuzzing import (
    NODE_NAMES,
    REAL_UUIDS,
    FuzzStack,
    Tally,
    batch_size,
    examples_per_target,
    long_campaign,
    sanity_pod,
    write_report,
)
from tests.invariants import quota_violations, settled_violations_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(0 if long_campaign() else 150)]

# A value sent as a bare JSON (or YAML) literal, whatever Python could encode: "1e10000000",
# a 5000-digit integer. It travels through the strategies as a marked string.
RAW = "\x00RAW:"
_RAW_JSON = re.compile(r'"\\u0000RAW:([^"]*)"')
_RAW_YAML = re.compile(r'"\\0RAW:([^"]*)"')


def raw(literal: str) -> str:
    return RAW + literal


def to_json(value: Any) -> bytes:
    return _RAW_JSON.sub(r"\1", json.dumps(value)).encode()


def to_yaml(value: Any) -> bytes:
    text = yaml.safe_dump(value, allow_unicode=True, width=1 << 30)
    return _RAW_YAML.sub(r"\1", text).encode()


def to_msgpack(value: Any) -> bytes:
    """msgpack, with integers beyond its range (-2^63 .. 2^64-1) pinned to its ends."""

    def pinned(item: Any) -> Any:
        if isinstance(item, bool):
            return item
        if isinstance(item, int):
            return min(max(item, -(2**63)), 2**64 - 1)
        if isinstance(item, list):
            return [pinned(each) for each in item]
        if isinstance(item, dict):
            return {pinned(k): pinned(v) for k, v in item.items()}
        return item

    return msgspec.msgpack.encode(pinned(value))


# Strategies ---------------------------------------------------------------------------

FUZZ_NODES = ("fuzz-1", "fuzz-2", "fuzz-3")
BIND_PODS = [f"bound-{i}" for i in range(6)]
"""Pods bound before each batch of the extender targets, for the inputs to hit."""
ODD_NAMES = ["", " ", "a b", "ünïcödé", "名前", "a.b", "a/b", "..", ".", "-a", "a-", "Upper",
             "a\x00b", "a\nb", "a\tb", "*", ">", "a.b.c", "%2F", "a%20b", "$JS.API.x", "null",
             "a" * 63, "a" * 64, "a" * 253, "a" * 254, "n" * 4100, "é" * 300, "\u202egpu",
             "default", "kube-system", "a.", "a..b", "a_b", "x" * 5000]
BIG_NUMBERS = [raw("1e10000000"), raw("1" * 5000), raw("-" + "9" * 5000), raw("1e308"),
               raw("1e309"), raw("-0"), raw("0.0000001"), raw("123456789012345678901234567890"),
               raw("1E400"), raw("-1e-400")]
ODD_QUANTITIES = ["1e10000000", "1" * 5000, "9" * 400, "1Gi", "10Mi", "1k", "-1", "0.5", "1e3",
                  "nan", "NaN", "inf", "-inf", "", " 1", "0x10", "1_000", "١٢٣", "1e-3", "+5",
                  2**53 + 1, 2**63, 2**64, -(2**63), 10**300]

junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


def pick(values: list[Any]) -> st.SearchStrategy[Any]:
    """One of ``values`` (``sampled_from`` would print every value in its repr)."""
    return st.integers(0, len(values) - 1).map(values.__getitem__)


def mostly(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The strategy nine times in ten, anything at all otherwise."""
    return st.one_of(*[strategy] * 9, junk)


valid_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?\Z")
names = st.one_of(
    valid_names, valid_names, valid_names, valid_names, valid_names, valid_names,
    st.text(max_size=24),
    pick(ODD_NAMES),
    st.integers(60, 5000).map(lambda n: "x" * n),
)
quantities = st.one_of(
    st.integers(0, 20000), st.integers(0, 100), st.integers(0, 4), st.integers(0, 4),
    st.integers(0, 100).map(str), st.integers(-(2**70), 2**70),
    st.sampled_from(BIG_NUMBERS), st.sampled_from(ODD_QUANTITIES), st.floats(),
    st.integers(0, 20000).map(str), st.text(max_size=8), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=2))
resource_names = st.one_of(
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                     "nvidia.com/gpucores", "cpu", "memory"]),
    st.text(max_size=20))
resources = st.dictionaries(resource_names, quantities, max_size=4)
gpu_limits = st.fixed_dictionaries(
    {"nvidia.com/gpu": st.one_of(st.integers(0, 3), quantities)},
    optional={"nvidia.com/gpumem": st.one_of(st.integers(1, 20000), quantities),
              "nvidia.com/gpucores": st.one_of(st.integers(0, 100), quantities)})
container = st.fixed_dictionaries(
    {"name": mostly(names)},
    optional={"image": st.just("ubuntu:22.04"),
              "resources": mostly(st.fixed_dictionaries({}, optional={
                  "limits": st.one_of(gpu_limits, gpu_limits, resources),
                  "requests": resources}))})
ANNOTATION_KEYS = ["hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy",
                   "hami.io/device-scoring-weights", "nvidia.com/use-gpuuuid",
                   "nvidia.com/nouse-gpuuuid", "nvidia.com/use-gputype",
                   "nvidia.com/nouse-gputype", "nvidia.com/numa-bind",
                   "hami.io/vgpu-devices-allocated", "hami.io/vgpu-node",
                   "nvidia.com/vgpu-mode", "hami.io/vgpu-mig-allocations"]
annotation_values = st.one_of(
    st.sampled_from(["binpack", "spread", "mutex", "numa", "topology-aware", "mutex,binpack",
                     "slot=1,core=1,memory=1", "slot=0,core=0,memory=0", "slot=-1",
                     "slot=" + "9" * 5000, "true", "false", "GPU-node-a-0", "T4",
                     "GPU-node-a-0,NVIDIA,1000,0:;", ",,,", " , ", "mig", "hami-core",
                     "mig,hami-core", "mps", '[{"containerIndex":0,"deviceIndex":0,'
                     '"gpuUUID":"GPU-node-a-0","profile":"1g.10gb","placement":'
                     '{"start":6,"size":1}}]']),
    st.text(max_size=30), pick(ODD_NAMES))
annotations = st.dictionaries(st.one_of(st.sampled_from(ANNOTATION_KEYS), st.text(max_size=20)),
                              mostly(annotation_values), max_size=4)
metadata = st.fixed_dictionaries(
    {"name": mostly(names)},
    optional={"namespace": mostly(st.one_of(st.just("default"), names)),
              "annotations": mostly(annotations), "uid": st.text(max_size=10)})
spec = st.fixed_dictionaries(
    {"containers": mostly(st.lists(container, max_size=3))},
    optional={"initContainers": st.lists(container, max_size=2), "nodeName": names})
pods = st.fixed_dictionaries(
    {"metadata": mostly(metadata)},
    optional={"apiVersion": st.just("v1"),
              "kind": st.sampled_from(["Pod", "Pod", "Pod", "Deployment", "pod"]),
              "spec": mostly(spec)})

# Valid-shaped pods whose values are hostile: they reach the parser and the decision core.
shaped_pods = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("Pod"),
     "metadata": st.fixed_dictionaries(
         {"name": st.one_of(valid_names, valid_names, st.sampled_from(BIND_PODS)),
          "namespace": st.sampled_from(["default", "default", "team-a"])},
         optional={"annotations": st.dictionaries(st.sampled_from(ANNOTATION_KEYS),
                                                  annotation_values, max_size=3)}),
     "spec": st.fixed_dictionaries(
         {"containers": st.lists(st.fixed_dictionaries(
             {"name": valid_names, "resources": st.fixed_dictionaries(
                 {"limits": st.one_of(gpu_limits, gpu_limits, resources)})}),
             min_size=1, max_size=3)},
         optional={"initContainers": st.lists(st.fixed_dictionaries(
             {"name": valid_names, "resources": st.fixed_dictionaries({"limits": gpu_limits})}),
             max_size=1)})})
any_pods = st.one_of(shaped_pods, shaped_pods, pods)


def deep(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


def hostile_pod_bodies() -> list[bytes]:
    """Raw bodies no encoder would produce: nesting, literals, broken text, bombs."""
    return [
        b"", b"null", b"[]", b"{}", b"\xff\xfe\x00", b'{"Pod":', b"{" * 10,
        ('{"Pod":' + deep(100_000) + "}").encode(),
        ('{"Pod":{"metadata":' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}}").encode(),
        deep(100_000).encode(),
        b'{"Pod":{"metadata":{"name":"raw"},"spec":{"containers":[{"name":"c","resources":'
        b'{"limits":{"nvidia.com/gpu":1e10000000}}}]}},"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"raw"},"spec":{"containers":[{"name":"c","resources":'
        b'{"limits":{"nvidia.com/gpu":' + b"1" * 5000 + b'}}}]}},"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"raw"},"spec":{"containers":[{"name":"c","resources":'
        b'{"limits":{"nvidia.com/gpumem":"1e10000000"}}}]}},"NodeNames":["node-a"]}',
    ]


def known_pod(name: str, limits: dict[str, Any] | None = None,
              namespace: str = "default") -> dict[str, Any]:
    pod = sanity_pod(name, limits or {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    pod["metadata"]["namespace"] = namespace
    return pod


# The issue's own inputs, sent first by every HTTP target.
ISSUE_PODS = [
    known_pod("n" * 4100),
    known_pod("has space"), known_pod("ünïcödé"),
    known_pod("big-quantity", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1e10000000"}),
    known_pod("big-literal", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": raw("1" * 5000)}),
    known_pod("exp-literal", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": raw("1e10000000")}),
    known_pod("no-gpu", {"cpu": 1}),
    known_pod("two-cards", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10000}),
]


# The campaign ------------------------------------------------------------------------


def campaign(stack: FuzzStack, tally: Tally, strategy: st.SearchStrategy[Any],
             send: Callable[[Any], None], *, seeds: list[Any], tmp_path: Path,
             before_batch: Callable[[], None] = lambda: None,
             batch_problems: Callable[[], list[str]] = list) -> list[str]:
    """The seeds as a first batch, then batches of generated inputs, each followed by the
    checks; stop at the first batch that fails.

    Returns what the check after the last batch found; ``verdict`` judges it. (Asserting
    here would make pytest print this frame's arguments: a strategy's repr runs to
    gigabytes.)
    """
    started = time.monotonic()

    def check() -> list[str]:
        tally.batches += 1
        model_problems = batch_problems()
        found = model_problems + stack.problems_after_batch()
        # The invariants of tests.invariants, and the pod API's own (nothing acknowledged lost,
        # nothing refused or deleted present).
        tally.invariant_violations += len(model_problems) + stack.invariant_violations
        tally.failed_batch_checks += bool(found)
        return found

    before_batch()
    for seed in seeds:
        send(seed)
    problems = check()
    remaining = examples_per_target()
    while remaining > 0 and not problems:
        size = min(batch_size(), remaining)
        before_batch()

        @settings(max_examples=size, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def one_batch(value: Any) -> None:
            send(value)

        one_batch()
        remaining -= size
        problems = check()
    tally.seconds = time.monotonic() - started
    tally.problems = problems
    write_report([tally], tmp_path)
    return problems


def verdict(tally: Tally, problems: list[str]) -> None:
    """No server error, every input answered, nothing found after the last batch."""
    summary = (f"{tally.target}: {tally.inputs} inputs in {tally.batches} batches, "
               f"{tally.server_errors} server errors, {tally.no_answer} unanswered; "
               f"first offending: {tally.offending[:3]}; after batch {tally.batches}: "
               f"{problems[:8]}")
    assert tally.server_errors == 0, summary
    assert tally.no_answer == 0, summary
    assert not problems, summary


@pytest.fixture
def stack() -> Iterator[FuzzStack]:
    running = FuzzStack().start()
    yield running
    running.stop()


# Extender bodies ----------------------------------------------------------------------

node_lists = st.one_of(
    st.none(), st.just(list(NODE_NAMES)),
    st.lists(st.one_of(st.sampled_from(NODE_NAMES + FUZZ_NODES), names), max_size=6),
    st.integers(1000, 15000).map(lambda n: [*NODE_NAMES, *(f"absent-{i}" for i in range(n))]))
extender_args = st.fixed_dictionaries(
    {"Pod": mostly(any_pods)},
    optional={"NodeNames": mostly(node_lists),
              "Nodes": mostly(st.fixed_dictionaries({"items": st.one_of(st.none(), st.lists(
                  st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
                      {"name": st.one_of(st.sampled_from(NODE_NAMES), names)})}),
                  max_size=4))})),
              "Extra": junk})
# A plain request for a pod bound already, as a lagging kube-scheduler cache would send.
bound_pod_args = st.builds(
    lambda name, gpus, memory, nodes: {"Pod": known_pod(name, {
        "nvidia.com/gpu": gpus, "nvidia.com/gpumem": memory}), "NodeNames": nodes},
    st.sampled_from(BIND_PODS), st.integers(1, 2), st.integers(100, 16000),
    st.one_of(st.just(list(NODE_NAMES)), st.lists(st.sampled_from(NODE_NAMES), min_size=1,
                                                  max_size=3, unique=True)))
extender_bodies = st.one_of(extender_args.map(to_json), extender_args.map(to_json),
                            extender_args.map(to_json), bound_pod_args.map(to_json),
                            pick(hostile_pod_bodies()),
                            st.binary(max_size=64), junk.map(to_json))


def extender_seeds() -> list[bytes]:
    seeds = [to_json({"Pod": pod, "NodeNames": list(NODE_NAMES)}) for pod in ISSUE_PODS]
    seeds += [to_json({"Pod": pod, "Nodes": {"items": [{"metadata": {"name": n}}
                                                       for n in NODE_NAMES]}})
              for pod in ISSUE_PODS]
    seeds += hostile_pod_bodies()
    if long_campaign():  # the issue's 57 MB body; its cost belongs to the long run
        seeds.append(to_json({"Pod": known_pod("huge"),
                              "NodeNames": [f"n-{i:07d}" * 6 for i in range(1_000_000)]}))
    return seeds


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_fuzzed_extender_args_never_get_a_server_error_or_break_the_ledger(
        stack: FuzzStack, tmp_path: Path, verb: str) -> None:
    """Some of the pods sent are already bound (kube-scheduler's cache may lag): a /filter
    of one must leave its booked cards alone."""
    tally = Tally(f"extender /{verb}")

    def fresh_pods() -> None:
        stack.delete_every_pod()
        seed_bound_pods(stack)

    found = campaign(stack, tally, extender_bodies,
                     lambda body: stack.send(tally, "POST", f"/{verb}", body),
                     seeds=extender_seeds(), tmp_path=tmp_path, before_batch=fresh_pods)
    verdict(tally, found)


def seed_bound_pods(stack: FuzzStack) -> None:
    """Pods the binds can hit: bound by the daemon's own loop before each batch."""
    for name in BIND_PODS:
        stack.request("POST", "/api/pods", to_json(known_pod(name)))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = json.loads(stack.request("GET", "/api/pods").body)
        if all(p["node"] is not None for p in listed if p["name"] in BIND_PODS):
            return
        time.sleep(0.1)


binding_args = st.fixed_dictionaries(
    {"PodName": mostly(st.one_of(st.sampled_from(BIND_PODS), st.sampled_from(BIND_PODS),
                                 names)),
     "PodNamespace": mostly(st.one_of(st.just("default"), st.just("default"), names)),
     "Node": mostly(st.one_of(st.sampled_from(NODE_NAMES), st.sampled_from(NODE_NAMES),
                              names))},
    optional={"PodUID": mostly(st.text(max_size=36))})
binding_bodies = st.one_of(binding_args.map(to_json), binding_args.map(to_json),
                           binding_args.map(to_json), pick(hostile_pod_bodies()),
                           st.binary(max_size=64))


def test_fuzzed_binds_never_get_a_server_error_or_break_the_ledger(
        stack: FuzzStack, tmp_path: Path) -> None:
    tally = Tally("extender /bind")
    seeds = [to_json({"PodName": name, "PodNamespace": "default", "Node": node})
             for name in BIND_PODS[:2] for node in NODE_NAMES]
    seeds += [to_json({"PodName": "n" * 4100, "PodNamespace": "default", "Node": "node-a"}),
              to_json({"PodName": "x", "PodNamespace": "default", "Node": "n" * 5000}),
              to_json({"PodName": 5, "PodNamespace": [], "Node": None})]

    def fresh_pods() -> None:
        stack.delete_every_pod()
        seed_bound_pods(stack)

    found = campaign(stack, tally, binding_bodies,
                     lambda body: stack.send(tally, "POST", "/bind", body),
                     seeds=seeds, tmp_path=tmp_path, before_batch=fresh_pods)
    verdict(tally, found)


def with_priority(pod: Any, priority: Any) -> Any:
    """The pod with ``spec.priority`` set, when it is a pod with a spec at all."""
    if isinstance(pod, dict) and isinstance(pod.get("spec"), dict):
        return {**pod, "spec": {**pod["spec"], "priority": priority}}
    return pod


meta_victims = st.fixed_dictionaries(
    {}, optional={"Pods": mostly(st.lists(st.fixed_dictionaries(
        {}, optional={"UID": mostly(st.text(max_size=40))}), max_size=4)),
        "NumPDBViolations": mostly(st.integers(-2**70, 2**70))})
preemption_args = st.fixed_dictionaries(
    {"Pod": st.builds(with_priority, mostly(any_pods),
                      st.one_of(st.integers(-10, 2000), st.integers(-2**70, 2**70), junk))},
    optional={"NodeNameToMetaVictims": mostly(st.dictionaries(
                  st.one_of(st.sampled_from(NODE_NAMES), names), st.one_of(st.none(),
                                                                          meta_victims),
                  max_size=4)),
              "NodeNameToVictims": mostly(st.dictionaries(
                  st.one_of(st.sampled_from(NODE_NAMES), names), st.one_of(st.none(), junk),
                  max_size=3))})
preemption_bodies = st.one_of(preemption_args.map(to_json), preemption_args.map(to_json),
                              pick(hostile_pod_bodies()), st.binary(max_size=64))


def test_fuzzed_preemption_args_never_get_a_server_error_or_evict_through_the_verb(
        stack: FuzzStack, tmp_path: Path) -> None:
    """The preempt verb only answers: whatever it is sent, no pod goes."""
    tally = Tally("extender /preempt")
    seeds = [to_json({"Pod": with_priority(known_pod(name), 1000), "NodeNameToMetaVictims": {
        node: {"Pods": [], "NumPDBViolations": 0} for node in NODE_NAMES}})
        for name in ("urgent", "n" * 4100)]
    seeds.append(to_json({"Pod": known_pod("x"), "NodeNameToMetaVictims": {"n" * 5000: None}}))

    def fresh_pods() -> None:
        stack.delete_every_pod()
        seed_bound_pods(stack)

    def evicted() -> list[str]:
        listed = {p["name"] for p in json.loads(stack.request("GET", "/api/pods").body)}
        return [f"the preempt verb evicted {name}" for name in BIND_PODS if name not in listed]

    found = campaign(stack, tally, preemption_bodies,
                     lambda body: stack.send(tally, "POST", "/preempt", body),
                     seeds=seeds, tmp_path=tmp_path, before_batch=fresh_pods,
                     batch_problems=evicted)
    verdict(tally, found)


# Pod manifests ---------------------------------------------------------------------------


def hostile_yaml_bodies() -> list[bytes]:
    laughs = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        laughs += f"{level}: &{level} [*{previous},*{previous},*{previous},*{previous},*" \
                  f"{previous},*{previous},*{previous},*{previous},*{previous}]\n"
    return [
        laughs.encode(), deep(100_000).encode(), b"!!python/object/apply:os.system ['true']",
        b"---\nkind: Pod\n---\nkind: Pod\n", b"kind: Pod\nmetadata: {name: [1, 2]}\n",
        b"\t- x", b"metadata:\n  name: " + b"y" * 4100 + b"\n", b"metadata: *undefined\n",
        b"kind: Pod\nmetadata:\n  name: yaml-big\nspec:\n  containers:\n  - name: c\n"
        b"    resources:\n      limits:\n        nvidia.com/gpu: 1e10000000\n",
    ]


class AcknowledgedPods:
    """What the pod API said it accepted: after a batch the store holds exactly these."""

    def __init__(self, stack: FuzzStack, tally: Tally) -> None:
        self.stack = stack
        self.tally = tally
        self.keys: set[tuple[str, str]] = set()

    def submit(self, body: bytes) -> None:
        answer = self.stack.send(self.tally, "POST", "/api/pods", body)
        if answer is not None and answer.status == 201:
            created = json.loads(answer.body)
            self.keys.add((created["namespace"] or "default", created["name"]))

    def problems(self) -> list[str]:
        listed = json.loads(self.stack.request("GET", "/api/pods").body)
        stored = {(p["namespace"] or "default", p["name"]) for p in listed}
        problems = [f"pod {ns}/{name[:80]} was acknowledged (201) but is gone"
                    for ns, name in sorted(self.keys - stored)]
        problems += [f"pod {ns}/{name[:80]} is in the store but was never acknowledged"
                     for ns, name in sorted(stored - self.keys) if not name.startswith("sanity")]
        for namespace, name in sorted(self.keys & stored)[:50]:
            path = (f"/api/pods/{urllib.parse.quote(namespace, safe='')}/"
                    f"{urllib.parse.quote(name, safe='')}")
            answer = self.stack.request("GET", path)
            if answer.status != 200:
                problems.append(f"GET of acknowledged pod {namespace}/{name[:80]}: "
                                f"HTTP {answer.status}")
        return problems

    def forget_all(self) -> list[str]:
        problems = self.stack.delete_every_pod()
        self.keys.clear()
        return problems


manifest_bodies = st.one_of(any_pods.map(to_json), any_pods.map(to_json), any_pods.map(to_yaml),
                            pick(hostile_yaml_bodies() + hostile_pod_bodies()),
                            junk.map(to_json), st.binary(max_size=64))


def test_fuzzed_pod_manifests_never_get_a_server_error_and_nothing_acknowledged_is_lost(
        stack: FuzzStack, tmp_path: Path) -> None:
    tally = Tally("pod API manifests")
    acknowledged = AcknowledgedPods(stack, tally)
    seeds = [to_json(pod) for pod in ISSUE_PODS] + [to_yaml(pod) for pod in ISSUE_PODS]
    seeds += hostile_yaml_bodies()

    def check_then_clean() -> list[str]:
        # Let the pending loop place what fits, then read the invariants with the batch's
        # pods in place. The normal-pod check after it needs room: a batch of whole-card
        # pods may fill every card, so the batch is deleted first.
        time.sleep(1.0)
        problems = acknowledged.problems() + settled_violations_sync(stack.url)
        return problems + acknowledged.forget_all()

    def clean() -> None:
        acknowledged.forget_all()

    found = campaign(stack, tally, manifest_bodies, acknowledged.submit, seeds=seeds,
                     tmp_path=tmp_path, before_batch=clean, batch_problems=check_then_clean)
    verdict(tally, found)


# Pod-API paths ---------------------------------------------------------------------------

PATH_PODS = [("default", "plain"), ("default", "a.b"), ("a.b", "x"), ("a", "b.x"),
             ("default", "has space"), ("default", "ünï"), ("default", "p" * 253),
             ("ns-1", "p")]


class PathModel:
    """GET and DELETE judged against the pods the API acknowledged."""

    def __init__(self, stack: FuzzStack, tally: Tally) -> None:
        self.stack = stack
        self.tally = tally
        self.present: set[tuple[str, str]] = set()
        self.wrong: list[str] = []

    def seed(self) -> None:
        self.stack.delete_every_pod()
        self.present.clear()
        for namespace, name in PATH_PODS:
            answer = self.stack.request("POST", "/api/pods",
                                        to_json(known_pod(name, namespace=namespace)))
            if answer.status == 201:
                self.present.add((namespace, name))

    def act(self, operation: tuple[str, str, str, bool]) -> None:
        method, namespace, name, quoted = operation
        if quoted:
            path = (f"/api/pods/{urllib.parse.quote(namespace, safe='')}/"
                    f"{urllib.parse.quote(name, safe='')}")
        else:
            path = f"/api/pods/{namespace}/{name}"
            if not path.isascii() or not path.isprintable() or " " in path:
                path = urllib.parse.quote(path, safe="/")
        answer = self.stack.send(self.tally, method, path)
        if answer is None or answer.status >= 500:
            return
        target = (namespace, name)
        exists = target in self.present and (quoted or "/" not in namespace + name)
        if exists and method == "GET":
            body = json.loads(answer.body) if answer.status == 200 else {}
            if answer.status != 200 or (body.get("namespace"), body.get("name")) != target:
                self._wrong(f"GET {path[:120]} of an existing pod: HTTP {answer.status}")
        elif exists:
            if answer.status != 204:
                self._wrong(f"DELETE {path[:120]} of an existing pod: HTTP {answer.status}")
            self.present.discard(target)
        elif answer.status < 400 and quoted:
            self._wrong(f"{method} {path[:120]} of a pod the API never acknowledged (or "
                        f"already deleted): HTTP {answer.status}")

    def _wrong(self, text: str) -> None:
        if len(self.wrong) < 20:
            self.wrong.append(text)

    def problems(self) -> list[str]:
        listed = json.loads(self.stack.request("GET", "/api/pods").body)
        stored = {(p["namespace"] or "default", p["name"]) for p in listed
                  if not p["name"].startswith("sanity")}
        problems = list(self.wrong)
        problems += [f"pod {ns}/{name[:60]} disappeared without a DELETE of it"
                     for ns, name in sorted(self.present - stored)]
        self.wrong = []
        return problems


path_names = st.one_of(st.sampled_from([n for _, n in PATH_PODS]), names)
path_namespaces = st.one_of(st.sampled_from([ns for ns, _ in PATH_PODS]), names)
path_operations = st.builds(
    lambda method, target, quoted: (method, *target, quoted),
    st.sampled_from(["GET", "GET", "DELETE"]),
    st.one_of(st.sampled_from(PATH_PODS), st.tuples(path_namespaces, path_names)),
    st.booleans())


def test_fuzzed_pod_paths_never_get_a_server_error_nor_touch_another_pod(
        stack: FuzzStack, tmp_path: Path) -> None:
    tally = Tally("pod API paths")
    model = PathModel(stack, tally)
    seeds = [("GET", "default", "n" * 4100, True), ("GET", "default", "has space", True),
             ("GET", "default", "ünï", True), ("DELETE", "a", "b.x", True),
             ("GET", "a.b", "x", True), ("DELETE", "default", "a b", True),
             ("GET", "..", "..", False), ("GET", "default", "%00", False)]
    found = campaign(stack, tally, path_operations, model.act, seeds=seeds, tmp_path=tmp_path,
                     before_batch=model.seed, batch_problems=model.problems)
    verdict(tally, found)


# ResourceQuota bodies --------------------------------------------------------------------

QUOTA_NAMESPACES = ["team-a", "team-b", "default"]
QUOTA_NAMES = ["gpu-quota", "small", "high-only"]
MEMORY_KEY, CORES_KEY = "limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores"
QUOTA_SERIES = re.compile(r"^pyhami_resource_quota_limit\{([^}]*)\} (\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
CHECK_PODS = 12
"""Pods placed after each batch's quotas, for the quota invariant."""

quota_limits = st.one_of(st.integers(0, 20000), st.integers(0, 20000).map(str),
                         st.integers(0, 400), st.sampled_from(["2Ki", "4k", "1e3", "10Gi"]),
                         quantities)
valid_scopes = st.sampled_from([[], ["NotTerminating"], ["NotBestEffort"], ["Terminating"],
                                ["BestEffort"]])
scope_names = st.one_of(
    st.sampled_from(["Terminating", "NotTerminating", "BestEffort", "NotBestEffort",
                     "PriorityClass", "CrossNamespacePodAffinity"]), st.text(max_size=12))
valid_selectors = st.sampled_from([
    {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                           "values": ["high"]}]},
    {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "NotIn",
                           "values": ["high"]}]},
    {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "Exists"}]}])
scope_expressions = st.fixed_dictionaries(
    {"scopeName": mostly(scope_names)},
    optional={"operator": mostly(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist",
                                                  "Near"])),
              "values": mostly(st.lists(st.one_of(st.sampled_from(["high", "low"]),
                                                  st.text(max_size=10)), max_size=3))})
gpu_hard = st.fixed_dictionaries({}, optional={
    MEMORY_KEY: st.one_of(st.integers(0, 12000), st.integers(0, 12000).map(str)),
    CORES_KEY: st.one_of(st.integers(0, 400), st.integers(0, 400).map(str)),
    "pods": st.just("10")})
any_hard = st.dictionaries(
    st.one_of(st.sampled_from([MEMORY_KEY, MEMORY_KEY, CORES_KEY, "pods", "cpu",
                               "limits.nvidia.com/gpu", "requests.nvidia.com/gpumem"]),
              st.text(max_size=20)),
    mostly(quota_limits), max_size=4)
# Two in three specs a quota pyhami applies (so that many are stored, replaced, deleted and
# applied), the others anything a spec may hold.
quota_specs = st.one_of(
    st.fixed_dictionaries({"hard": gpu_hard}, optional={"scopes": valid_scopes}),
    st.fixed_dictionaries({"hard": gpu_hard}, optional={"scopeSelector": valid_selectors}),
    st.fixed_dictionaries({}, optional={
        "hard": mostly(any_hard), "scopes": mostly(st.lists(scope_names, max_size=2)),
        "scopeSelector": mostly(st.fixed_dictionaries({}, optional={
            "matchExpressions": mostly(st.lists(scope_expressions, max_size=2))}))}))
quota_names = st.one_of(st.sampled_from(QUOTA_NAMES), st.sampled_from(QUOTA_NAMES), names)
quota_namespaces = st.one_of(st.sampled_from(QUOTA_NAMESPACES),
                             st.sampled_from(QUOTA_NAMESPACES), names)
shaped_quotas = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("ResourceQuota"),
     "metadata": st.fixed_dictionaries(
         {"name": quota_names},
         optional={"namespace": quota_namespaces,
                   "labels": st.dictionaries(st.text(max_size=8), st.text(max_size=8),
                                             max_size=2),
                   "uid": st.text(max_size=10)}),
     "spec": quota_specs},
    optional={"status": junk})
any_quotas = st.one_of(shaped_quotas, shaped_quotas, shaped_quotas, st.fixed_dictionaries(
    {"metadata": mostly(metadata)},
    optional={"kind": st.sampled_from(["ResourceQuota", "Pod", "resourcequota"]),
              "spec": mostly(quota_specs)}))
quota_bodies = st.one_of(any_quotas.map(to_json), any_quotas.map(to_json),
                         any_quotas.map(to_json), any_quotas.map(to_yaml),
                         pick(hostile_yaml_bodies() + hostile_pod_bodies()),
                         junk.map(to_json), st.binary(max_size=64))


def put_body(manifest: Any, namespace: str, name: str, named: bool) -> bytes:
    """A PUT's body: the manifest named as the URL names it, when ``named`` and it can be."""
    if named and isinstance(manifest, dict) and isinstance(manifest.get("metadata"), dict):
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace,
                                             "name": name}}
    return to_json(manifest)


quota_paths = st.tuples(st.sampled_from([*QUOTA_NAMESPACES, "ns-with-none"]),
                        st.sampled_from(QUOTA_NAMES))
quota_operations_of: dict[str, st.SearchStrategy[Any]] = {
    "POST": quota_bodies.map(lambda body: ("POST", None, None, body)),
    "PUT": st.builds(lambda path, manifest, named: ("PUT", *path,
                                                     put_body(manifest, *path, named)),
                     st.one_of(quota_paths, st.tuples(quota_namespaces, quota_names)),
                     any_quotas, st.sampled_from([True, True, True, False])),
    "GET": st.builds(lambda path: ("GET", *path), st.one_of(
        quota_paths, st.tuples(quota_namespaces, quota_names))).map(lambda op: (*op, None)),
    "DELETE": st.builds(lambda path: ("DELETE", *path), st.one_of(
        quota_paths, st.tuples(quota_namespaces, quota_names))).map(lambda op: (*op, None)),
}
# The method drawn first: hypothesis's one_of favours its first strategies.
quota_operations = st.sampled_from(["POST", "POST", "POST", "PUT", "PUT", "PUT", "DELETE",
                                    "GET"]).flatmap(quota_operations_of.__getitem__)


def one_line(body: bytes) -> bool:
    return bool(body.strip()) and b"\n" not in body.strip()


class QuotaModel:
    """What /api/resourcequotas acknowledged, against which every answer, the list, the
    daemon's applied limits and the quota invariant are judged."""

    def __init__(self, stack: FuzzStack, tally: Tally) -> None:
        self.stack = stack
        self.tally = tally
        self.stored: dict[tuple[str, str], Any] = {}
        self.wrong: list[str] = []

    def act(self, operation: tuple[str, str | None, str | None, bytes | None]) -> None:
        method, namespace, name, body = operation
        path = "/api/resourcequotas"
        if namespace is not None and name is not None:
            path += (f"/{urllib.parse.quote(namespace, safe='')}/"
                     f"{urllib.parse.quote(name, safe='')}")
        answer = self.stack.send(self.tally, method, path, body)
        if answer is None or answer.status >= 500:
            return
        shown = f"{method} {path[:100]} -> {answer.status}"
        if answer.status >= 400 and not one_line(answer.body):
            self._wrong(f"{shown} without a one-line message: {answer.body[:200]!r}")
        target = (namespace, name)
        if answer.status in (200, 201) and method in ("POST", "PUT"):
            stored = json.loads(answer.body)
            key = (stored["metadata"]["namespace"], stored["metadata"]["name"])
            if method == "PUT" and key != target:
                self._wrong(f"{shown} stored {key}")
            if (answer.status == 201) == (key in self.stored):
                self._wrong(f"{shown}: the model {'holds' if key in self.stored else 'lacks'} "
                            f"{key}")
            self.stored[key] = stored
        elif method == "DELETE" and answer.status in (204, 404):
            if (answer.status == 204) != (target in self.stored):
                self._wrong(f"{shown}: the model {'holds' if target in self.stored else 'lacks'}"
                            f" {target}")
            self.stored.pop(target, None)  # type: ignore[arg-type]
        elif method == "GET" and answer.status in (200, 404):
            expected = self.stored.get(target)  # type: ignore[arg-type]
            if (json.loads(answer.body) if answer.status == 200 else None) != expected:
                self._wrong(f"{shown}: the model holds {str(expected)[:200]}")

    def _wrong(self, text: str) -> None:
        if len(self.wrong) < 20:
            self.wrong.append(text)

    def applied_limits(self) -> set[tuple[str, str, str, int]]:
        """The GPU limits the model's quotas set: (namespace, quota, resource, limit)."""
        limits = set()
        for quota in self.parsed():
            for resource, limit in (("nvidia.com/gpumem", quota.memory),
                                    ("nvidia.com/gpucores", quota.cores)):
                if limit is not None:
                    limits.add((quota.namespace, quota.name, resource, limit))
        return limits

    def parsed(self) -> list[Quota]:
        return [parse_quota(msgspec.convert(stored, ResourceQuotaManifest))
                for stored in self.stored.values()]

    def problems(self) -> list[str]:
        """The answers that disagreed with the model; the list and the daemon's limits
        against it; then pods placed under the batch's quotas, and the quota invariant."""
        problems, self.wrong = self.wrong, []
        listed = json.loads(self.stack.request("GET", "/api/resourcequotas").body)["items"]
        in_store = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in listed}
        if in_store != self.stored:
            problems.append(f"the store lists {sorted(in_store)[:10]}, the model holds "
                            f"{sorted(self.stored)[:10]}")
        metrics = self.stack.request("GET", "/metrics", port=self.stack.metrics_port).body
        applied = set()
        for labels, value in QUOTA_SERIES.findall(metrics.decode()):
            named = dict(LABEL.findall(labels))
            applied.add((named["namespace"], named["resource_quota"], named["resource"],
                         int(float(value))))
        if applied != self.applied_limits():
            problems.append(f"the daemon applies {sorted(applied)[:10]}, the model's quotas "
                            f"set {sorted(self.applied_limits())[:10]}")
        return problems + self._placed_under_the_quotas()

    def _placed_under_the_quotas(self) -> list[str]:
        """Pods of the quotas' namespaces, placed now that the quotas are written: none may
        take a namespace past a quota."""
        pods = [known_pod(f"under-{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem":
                                          1000 + 500 * (i % 7)},
                          QUOTA_NAMESPACES[i % len(QUOTA_NAMESPACES)])
                for i in range(CHECK_PODS)]
        for i, pod in enumerate(pods):
            if i % 3 == 0:
                pod["spec"]["priorityClassName"] = "high"
            self.stack.request("POST", "/api/pods", to_json(pod))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listed = json.loads(self.stack.request("GET", "/api/pods").body)
            if all(p["node"] is not None or p["events"] for p in listed
                   if p["name"].startswith("under-")):
                break
            time.sleep(0.1)
        subjects = {f"{pod['metadata']['namespace']}/{pod['metadata']['name']}":
                    QuotaSubject.of(msgspec.convert(pod, PodManifest)) for pod in pods}
        ledger = json.loads(self.stack.request("GET", "/ledgerz").body)
        return quota_violations(ledger, self.parsed(), subjects)

    def forget_all(self) -> list[str]:
        """Delete every quota and every pod (the checks after the batch need room)."""
        problems = self.stack.delete_every_pod()
        listed = json.loads(self.stack.request("GET", "/api/resourcequotas").body)["items"]
        for quota in listed:
            metadata = quota["metadata"]
            path = f"/api/resourcequotas/{metadata['namespace']}/{metadata['name']}"
            status = self.stack.request("DELETE", path).status
            if status != 204:
                problems.append(f"DELETE {path[:200]}: HTTP {status}")
        self.stored.clear()
        return problems


def quota_seeds() -> list[tuple[str, str | None, str | None, bytes | None]]:
    """The issue's quotas: valid ones (a PUT raising one), a limit that is no quantity,
    negative, beyond 2^53 or an integer beyond any, an unknown scope, a bad expression, bad
    names, a quota of Kubernetes' resources only, and hostile bodies."""

    def body(name: str, hard: dict[str, Any], namespace: str = "team-a",
             **spec: Any) -> bytes:
        return to_json({"apiVersion": "v1", "kind": "ResourceQuota",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"hard": hard, **spec}})

    post: list[bytes] = [
        body("gpu-quota", {MEMORY_KEY: "4000", CORES_KEY: "150"}),
        body("small", {MEMORY_KEY: 2500}, namespace="team-b"),
        body("high-only", {MEMORY_KEY: "1000"}, scopeSelector={"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}),
        body("cpu-only", {"cpu": "4", "pods": "10"}),
        body("bad", {MEMORY_KEY: "lots"}), body("bad", {MEMORY_KEY: "-1"}),
        body("bad", {MEMORY_KEY: str(2**53 + 1)}), body("bad", {CORES_KEY: raw("1" * 5000)}),
        body("bad", {MEMORY_KEY: raw("1e10000000")}), body("bad", {MEMORY_KEY: "1e10000000"}),
        body("bad", {}, scopes=["Forever"]),
        body("bad", {}, scopeSelector={"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In"}]}),
        body("Bad_Name", {MEMORY_KEY: 1}), body("n" * 300, {MEMORY_KEY: 1}),
        body("bad", {MEMORY_KEY: 1}, namespace="a.b"),
        *hostile_yaml_bodies(), *hostile_pod_bodies(),
    ]
    operations: list[tuple[str, str | None, str | None, bytes | None]] = [
        ("POST", None, None, data) for data in post]
    operations += [("PUT", "team-a", "gpu-quota", body("gpu-quota", {MEMORY_KEY: "6000"})),
                   ("GET", "team-a", "gpu-quota", None), ("DELETE", "team-b", "small", None),
                   ("DELETE", "team-b", "small", None), ("GET", "n" * 4100, "x", None)]
    return operations


def test_fuzzed_quota_bodies_never_get_a_server_error_and_never_let_a_namespace_past_a_quota(
        stack: FuzzStack, tmp_path: Path) -> None:
    """Every answer agrees with what was acknowledged, a refusal is a 4xx with a one-line
    message, the daemon applies exactly the stored quotas' limits, and pods placed under
    them take no namespace past any."""
    tally = Tally("pod API ResourceQuotas")
    model = QuotaModel(stack, tally)

    def check_then_clean() -> list[str]:
        return model.problems() + model.forget_all()

    found = campaign(stack, tally, quota_operations, model.act, seeds=quota_seeds(),
                     tmp_path=tmp_path, before_batch=lambda: None,
                     batch_problems=check_then_clean)
    verdict(tally, found)



# Inventory messages on NATS ------------------------------------------------------------------

MSGPACK_INTS = st.one_of(
    st.integers(0, 100_000), st.integers(0, 100),
    st.sampled_from([0, 1, 2**31, 2**32, 2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1,
                     -1, -(2**63)]),
    st.integers(-(2**63), 2**64 - 1))


def card_of(subject_node: str) -> st.SearchStrategy[dict[str, Any]]:
    uuid = st.one_of(st.integers(0, 7).map(lambda i: f"GPU-{subject_node}-{i}"),
                     st.integers(0, 7).map(lambda i: f"GPU-{subject_node}-{i}"),
                     st.sampled_from(REAL_UUIDS),
                     st.text(max_size=20).map(lambda t: f"GPU-{subject_node}-{t}"))
    return st.fixed_dictionaries(
        {"uuid": uuid, "index": mostly(MSGPACK_INTS),
         "type": mostly(st.one_of(st.just("NVIDIA-Tesla T4"), st.text(max_size=30))),
         "memory": mostly(st.one_of(st.just(15360), MSGPACK_INTS))},
        optional={"cores": mostly(MSGPACK_INTS), "count": mostly(MSGPACK_INTS),
                  "numa": mostly(MSGPACK_INTS), "health": mostly(st.booleans()),
                  "links": mostly(st.one_of(st.none(), st.dictionaries(
                      st.one_of(st.sampled_from(REAL_UUIDS), st.text(max_size=10)),
                      MSGPACK_INTS, max_size=4))),
                  "processes": mostly(MSGPACK_INTS), "sm_count": mostly(MSGPACK_INTS),
                  "process_memory": MSGPACK_INTS, "health_detail": st.text(max_size=20)})


def many_cards(subject_node: str, count: int) -> list[dict[str, Any]]:
    return [{"uuid": f"GPU-{subject_node}-many-{i}", "index": i, "type": "NVIDIA-Tesla T4",
             "memory": 15360} for i in range(count)]


def inventory_for(subject_node: str) -> st.SearchStrategy[tuple[str, bytes]]:
    body_nodes = st.one_of(st.just(subject_node), st.just(subject_node), st.just(subject_node),
                           st.sampled_from(NODE_NAMES + FUZZ_NODES), names)
    # One message in about twenty carries thousands of cards.
    cards = st.one_of(*[st.lists(card_of(subject_node), max_size=8)] * 19,
                      st.integers(1000, 5000).map(lambda n: many_cards(subject_node, n)))
    message = st.fixed_dictionaries(
        {"schema": mostly(st.just(1)), "node": mostly(body_nodes),
         "agent_version": mostly(st.just("fuzz")),
         "instance": mostly(st.text(min_size=1, max_size=12)),
         "sequence": mostly(st.one_of(st.integers(1, 10**6), MSGPACK_INTS)),
         "timestamp": mostly(st.one_of(st.floats(), st.just(time.time()))),
         "reason": mostly(st.sampled_from(["start", "change", "heartbeat", "resync",
                                           "reconnect", "other"])),
         "heartbeat_interval": mostly(st.one_of(st.just(0.5), st.floats())),
         "cards": mostly(cards)},
        optional={"cordoned": mostly(st.lists(st.one_of(st.sampled_from(REAL_UUIDS),
                                                        st.text(max_size=10)), max_size=3))})
    encoded = st.one_of(message.map(to_msgpack), message.map(to_msgpack),
                        message.map(to_msgpack), st.binary(max_size=100))
    return encoded.map(lambda data: (f"pyhami.inventory.{subject_node}", data))


inventory_messages = st.sampled_from(FUZZ_NODES).flatmap(inventory_for)


def inventory_seeds() -> list[tuple[str, bytes]]:
    """The issue's messages: memory 2^63, a 5,000-character node, duplicate and foreign
    UUIDs, a node name that is not the subject's, thousands of cards."""

    def message(node: str, cards: list[dict[str, Any]], subject: str | None = None) -> tuple[
            str, bytes]:
        return (f"pyhami.inventory.{subject or node}", msgspec.msgpack.encode({
            "schema": 1, "node": node, "agent_version": "fuzz", "instance": f"seed-{node[:20]}",
            "sequence": int(time.time() * 1000), "timestamp": time.time(), "reason": "start",
            "heartbeat_interval": 0.5, "cards": cards}))

    t4 = {"type": "NVIDIA-Tesla T4", "memory": 15360}
    return [
        message("fuzz-1", [{"uuid": "GPU-fuzz-1-0", "index": 0, "type": "X", "memory": 2**63}]),
        message("fuzz-1", [{"uuid": "GPU-fuzz-1-0", "index": 0, **t4},
                           {"uuid": "GPU-fuzz-1-0", "index": 1, **t4}]),
        message("fuzz-2", [{"uuid": REAL_UUIDS[0], "index": 0, **t4}]),
        message("fuzz-3", [{"uuid": "GPU-fuzz-3-0", "index": 0, **t4}], subject="fuzz-2"),
        message("n" * 5000, [{"uuid": "GPU-fuzz-3-1", "index": 0, **t4}], subject="fuzz-3"),
        message("fuzz-3", many_cards("fuzz-3", 5000)),
    ]


def test_fuzzed_inventory_messages_never_break_scheduling_or_the_ledger(
        stack: FuzzStack, tmp_path: Path) -> None:
    tally = Tally("inventory messages")

    def settle() -> list[str]:
        time.sleep(0.5)  # the daemon digests what was published
        return []

    found = campaign(stack, tally, inventory_messages,
                     lambda message: stack.publish(tally, message[0], message[1]),
                     seeds=inventory_seeds(), tmp_path=tmp_path, batch_problems=settle)
    verdict(tally, found)
