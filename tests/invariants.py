"""The invariants of docs/reliability.md, checked over a live daemon from the outside.

A snapshot is what the daemon says over HTTP: ``GET /ledgerz`` (its ledger,
reservations and per-card usage beside each card's capacity as its agent
reported it) and ``GET /api/pods`` (the standalone pod store: each pod's node
and ``hami.io/vgpu-devices-allocated``). ``violations`` returns one line per
broken invariant, none when all hold:

- no card over its memory, cores or slots (``count``), counting every
  allocation in the ledger, bound or reserved; no container holding one card
  twice; no card UUID reported twice in the live fleet;
- the daemon's per-card usage equals the sum of the allocations it holds;
- the ledger holds exactly the bound, unfinished pods of the store, each with
  exactly the cards its annotation names, and no reservation for a pod the
  store shows bound;
- no reservation older than its TTL (plus the expiry loop's period).

``quota_violations`` checks one more, where the caller knows it must hold: no
ResourceQuota's pods are charged past its limit, while every pod holding cards was
placed after the quotas were last written (lowering a quota evicts nobody).

The annotation is decoded here, independently of the daemon's own decoder, and a pod's
charge is summed here from its cards.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from common.core.pod import QuotaSubject
from common.core.quota import Quota

ALLOCATED = "hami.io/vgpu-devices-allocated"
FINISHED_PHASES = ("Succeeded", "Failed")
# The daemon's expiry loop runs every second; a reservation may outlive its TTL by that much.
EXPIRY_SLACK_S = 2.5
# A bind in flight is briefly a reservation while the store already shows the pod bound.
SETTLE_S = 5.0

Grant = tuple[str, int, int]
"""One card given to one container: uuid, memory MiB, cores %."""


@dataclass(frozen=True)
class Snapshot:
    ledger: dict[str, Any]
    pods: list[dict[str, Any]]


def decode_allocated(text: str) -> list[list[Grant]]:
    """``UUID,TYPE,MEM,CORES:`` per card, ``;`` per container; ValueError when malformed."""
    if not text.endswith(";"):
        raise ValueError(f"{text[:80]!r} does not end with ';'")
    containers: list[list[Grant]] = []
    for segment in text.split(";")[:-1]:
        grants: list[Grant] = []
        for card in segment.split(":"):
            if not card:
                continue
            uuid, _vendor, memory, cores = card.split(",")
            grants.append((uuid.strip(), int(memory), int(cores)))
        containers.append(grants)
    return containers


def _ledger_containers(entry: dict[str, Any]) -> list[list[Grant]]:
    return [[(g["uuid"], int(g["memory"]), int(g["cores"])) for g in grants]
            for grants in entry["containers"]]


def footprint(containers: list[list[Grant]], init_containers: int) -> dict[str, Counter[str]]:
    """Per card: tenants, memory, cores; app containers summed, init containers at their peak."""
    app: dict[str, Counter[str]] = {}
    init: dict[str, Counter[str]] = {}
    for position, grants in enumerate(containers):
        for uuid, memory, cores in grants:
            one = Counter(tenants=1, memory=memory, cores=cores)
            if position < init_containers:
                init[uuid] = init.get(uuid, Counter()) | one
            else:
                app.setdefault(uuid, Counter()).update(one)
    for uuid, peak in init.items():
        app[uuid] = app.get(uuid, Counter()) | peak
    return app


def capacity_violations(ledger: dict[str, Any]) -> list[str]:
    """No card over its memory, cores or slots; usage table equal to the allocations."""
    problems: list[str] = []
    cards: dict[tuple[str, str], list[dict[str, Any]]] = {}
    nodes_of_uuid: dict[str, set[str]] = {}
    for card in ledger["cards"]:
        cards.setdefault((card["node"], card["uuid"]), []).append(card)
        nodes_of_uuid.setdefault(card["uuid"], set()).add(card["node"])
    for (node, uuid), same in sorted(cards.items()):
        if len(same) > 1:
            problems.append(f"card {uuid} is reported {len(same)} times on node {node}")
    for uuid, nodes in sorted(nodes_of_uuid.items()):
        if len(nodes) > 1:
            problems.append(f"card {uuid} is reported by {len(nodes)} nodes: "
                            f"{', '.join(sorted(nodes)[:5])}")
    booked: dict[tuple[str, str], Counter[str]] = {}
    for key, entry in sorted(ledger["pods"].items()):
        containers = _ledger_containers(entry)
        for position, grants in enumerate(containers):
            repeated = [u for u, n in Counter(g[0] for g in grants).items() if n > 1]
            if repeated:
                problems.append(f"pod {key}: container {position} holds card "
                                f"{repeated[0]} more than once")
        for uuid, usage in footprint(containers, int(entry["init_containers"])).items():
            booked.setdefault((entry["node"], uuid), Counter()).update(usage)
    for (node, uuid), same in sorted(cards.items()):
        usage = booked.get((node, uuid), Counter())
        card = same[0]
        reported = Counter(tenants=card["tenants"], memory=card["usedmem"],
                           cores=card["usedcores"])
        if +reported != +usage:
            problems.append(f"card {node}/{uuid}: the daemon counts {dict(+reported)} but its "
                            f"allocations sum to {dict(+usage)}")
        memory = min(c["memory"] for c in same)
        cores = min(c["cores"] for c in same)
        count = min(c["count"] for c in same)
        if usage["memory"] > memory:
            problems.append(f"card {node}/{uuid} over its memory: {usage['memory']} of "
                            f"{memory} MiB booked")
        if usage["cores"] > cores:
            problems.append(f"card {node}/{uuid} over its cores: {usage['cores']} of {cores}")
        if usage["tenants"] > count:
            problems.append(f"card {node}/{uuid} over its slots: {usage['tenants']} tenants "
                            f"of {count}")
    return problems


def reservation_violations(ledger: dict[str, Any]) -> list[str]:
    limit = float(ledger["reservation_ttl_s"]) + EXPIRY_SLACK_S
    return [f"reservation of {key} is {held['age_s']:.1f} s old (TTL "
            f"{ledger['reservation_ttl_s']:g} s)"
            for key, held in sorted(ledger["reservations"].items()) if held["age_s"] > limit]


def agreement_violations(ledger: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    """The ledger holds exactly the bound, unfinished pods, with their annotated cards."""
    problems: list[str] = []
    expected: dict[str, tuple[str, list[list[Grant]]]] = {}
    bare_bound: set[str] = set()
    for pod in pods:
        key = f"{pod['namespace'] or 'default'}/{pod['name']}"
        if pod["node"] is None or pod["phase"] in FINISHED_PHASES:
            continue
        text = (pod.get("annotations") or {}).get(ALLOCATED)
        if not text:
            bare_bound.add(key)  # bound holding no card (a pod that asks for no GPU)
            continue
        try:
            expected[key] = (pod["node"], decode_allocated(text))
        except ValueError:
            # docs/scheduler.md: a pod whose annotation does not decode is not counted.
            bare_bound.add(key)
    held = ledger["pods"]
    for key in sorted(bare_bound):
        cards = [g for grants in _ledger_containers(held[key]) for g in grants] \
            if key in held else []
        if cards:
            problems.append(f"pod {key} is bound without {ALLOCATED} but the ledger books "
                            f"{_text(_ledger_containers(held[key]))} for it")
    for key, (node, containers) in sorted(expected.items()):
        entry = held.get(key)
        if entry is None:
            problems.append(f"pod {key} is bound to {node} with {_text(containers)} but the "
                            "ledger holds nothing for it")
            continue
        if not entry["bound"]:
            problems.append(f"pod {key} is bound in the store but only reserved in the ledger")
        if entry["node"] != node or _ledger_containers(entry) != containers:
            problems.append(f"pod {key}: the store says {node} {_text(containers)}, the ledger "
                            f"{entry['node']} {_text(_ledger_containers(entry))}")
    for key in sorted(ledger["reservations"]):
        if key in expected or key in bare_bound:
            problems.append(f"pod {key} is bound in the store yet holds a reservation: its "
                            "cards are released when that expires")
    for key, entry in sorted(held.items()):
        if entry["bound"] and key not in expected and key not in bare_bound:
            problems.append(f"the ledger holds {key} as bound on {entry['node']} but the store "
                            "has no such bound, unfinished pod")
    for key in ledger["bound"]:
        if key not in held and key not in bare_bound:
            problems.append(f"the daemon counts {key} as bound but holds no cards for it")
    return problems


def quota_violations(ledger: dict[str, Any], quotas: Iterable[Quota],
                     subjects: Mapping[str, QuotaSubject]) -> list[str]:
    """No quota's pods charged past its limit, counting every pod of the ledger, bound or
    reserved: per card, its init containers at their peak beside its app containers summed
    (``footprint``), then summed over its cards.

    ``subjects`` gives, by pod key, what a quota's scopes read of a pod; a pod without one
    is charged to the quotas of its namespace that have no scopes. Holds while every pod
    holding cards was placed after the quotas were last written.
    """
    quotas = list(quotas)
    charged: dict[tuple[str, str], Counter[str]] = {}
    for key, entry in sorted(ledger["pods"].items()):
        cards = footprint(_ledger_containers(entry), int(entry["init_containers"]))
        charge = Counter(memory=sum(c["memory"] for c in cards.values()),
                         cores=sum(c["cores"] for c in cards.values()))
        namespace = key.partition("/")[0]
        subject = subjects.get(key)
        for quota in quotas:
            if quota.namespace != namespace:
                continue
            if quota.applies_to(subject) if subject is not None else not quota.rules:
                charged.setdefault((quota.namespace, quota.name), Counter()).update(charge)
    problems = []
    for quota in quotas:
        used = charged.get((quota.namespace, quota.name), Counter())
        for resource, limit in (("memory", quota.memory), ("cores", quota.cores)):
            if limit is not None and used[resource] > limit:
                problems.append(f"ResourceQuota {quota.key}: its pods hold {used[resource]} "
                                f"of GPU {resource}, over its limit of {limit}")
    return problems


def _text(containers: list[list[Grant]]) -> str:
    return ";".join(":".join(f"{u},{m},{c}" for u, m, c in grants) for grants in containers)


def violations(snapshot: Snapshot) -> list[str]:
    return (capacity_violations(snapshot.ledger) + reservation_violations(snapshot.ledger)
            + agreement_violations(snapshot.ledger, snapshot.pods))


# Reading a live daemon ---------------------------------------------------------------


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def snapshot_sync(daemon_url: str, timeout: float = 30.0) -> Snapshot:
    return Snapshot(_get_json(f"{daemon_url}/ledgerz", timeout),
                    _get_json(f"{daemon_url}/api/pods", timeout))


async def snapshot(session: aiohttp.ClientSession, daemon_url: str) -> Snapshot:
    async with session.get(f"{daemon_url}/ledgerz") as response:
        response.raise_for_status()
        ledger = await response.json()
    async with session.get(f"{daemon_url}/api/pods") as response:
        response.raise_for_status()
        pods = await response.json()
    return Snapshot(ledger, pods)


def settled_violations_sync(daemon_url: str, settle_s: float = SETTLE_S) -> list[str]:
    """The violations once binds in flight have landed: checked until none or ``settle_s``.

    A capacity violation is real at any instant; the agreement between ledger and store
    may lag a bind in flight by a moment, so only one that lasts is reported.
    """
    deadline = time.monotonic() + settle_s
    while True:
        found = violations(snapshot_sync(daemon_url))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


async def settled_violations(session: aiohttp.ClientSession, daemon_url: str,
                             settle_s: float = SETTLE_S) -> list[str]:
    """As ``settled_violations_sync``, for async callers."""
    deadline = time.monotonic() + settle_s
    while True:
        found = violations(await snapshot(session, daemon_url))
        if not found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)
