"""HAMi's tests of how a container's request is read (``cases/requests.yaml``).

HAMi's scheduler reads a container into a ``ContainerDeviceRequest`` (``Nums``;
``Memreq`` in MiB, 0 for none; ``MemPercentagereq``, 101 for unset; ``Coresreq``);
pyhami's ``parse_pod`` into a ``ContainerRequest`` (``cards``, ``memory_mib``, None for
none, ``memory_percent``, ``cores``). ``hami_fields`` writes pyhami's reading in HAMi's
fields, and a row compares the fields HAMi's test asserts. One reading is not told
apart: a container naming both ``gpumem`` and a share of exactly 100 (HAMi keeps 100,
the fields here say 101); no row names both.

pyhami applies HAMi's webhook defaults when it reads a pod (the card count, and whole
cards' cores for a count-only request: ``webhook-defaults-applied``), where
``GenerateResourceRequests`` alone, as these tests call it, applies none.
"""

from __future__ import annotations

from typing import Any

from common.core import PodRejected, parse_pod
from common.core.deviceconfig import DeviceConfig
from common.core.pod import (
    Container,
    ContainerRequest,
    PodManifest,
    PodSpec,
    whole_quantity,
)
from tests.builders import fleet_of, hold, manifest, node, run, under
from tests.core.hami.readings import asserted, container_of, device_of
from tests.core.hami.tables import Row, cases


def hami_fields(request: ContainerRequest) -> dict[str, int]:
    """pyhami's reading of one container in HAMi's ``ContainerDeviceRequest`` fields; a
    container asking for no card is HAMi's empty request, ``{}``."""
    if request.cards == 0:
        return {}
    memory_set = request.memory_mib is not None
    return {
        "nums": request.cards,
        "memreq": request.memory_mib or 0,
        "mempercentagereq": 101 if memory_set and request.memory_percent == 100
        else request.memory_percent,
        "coresreq": request.cores,
    }


def read(container: Container, device: DeviceConfig) -> dict[str, Any]:
    """One container's request as HAMi's fields, or what refused it."""
    pod = PodManifest(spec=PodSpec(containers=[container]))
    try:
        return hami_fields(parse_pod(pod, under(device)).containers[0])
    except PodRejected as error:
        return {"refused": str(error)}


def fit(given: dict[str, Any]) -> dict[str, Any]:
    """A one-card node holding ``used_memory`` MiB: whether the container fits, the MiB
    it is booked, or the card's reason."""
    fleet = fleet_of(node("n", 1, **given["card"]))
    if given["used_memory"]:
        hold(fleet, "default/tenant", "n", "GPU-n-0", memory=given["used_memory"])
    decision = run(fleet, manifest(containers=[given["limits"]]))
    if decision.allocation is not None:
        (grant,), = decision.allocation.containers
        return {"fits": True, "booked_memory": grant.memory}
    assert decision.failed_nodes is not None
    return {"fits": False, "reason": decision.failed_nodes["n"].removeprefix("1/1 ")}


def answer(row: Row) -> Any:
    given = row.given
    if "quantity" in given:
        return whole_quantity(given["quantity"], "quantity")
    if "card" in given:
        return fit(given)
    device = device_of(given)
    reading = read(container_of(given.get("limits"), given.get("requests")), device)
    if "same_as" in given:
        return "same" if reading == read(container_of(given["same_as"]), device) else reading
    return reading


@cases("requests")
def test_hami_case(row: Row) -> None:
    assert asserted(answer(row), row.expected) == row.expected
