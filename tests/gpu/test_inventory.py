"""Check 1, the inventory: what the agent reads of each card through the real NVML
(``agent.vendors.nvidia.nvml.NvmlSource``, as ``--inventory nvml`` runs it) against nvidia-smi's own
answer and sysfs, field by field, and against the simulated profile of the same model.

The fakes (``tests/fakes/nvml.py``) answer what nvml.h documents; only a real driver says
what it answers on this card: its name (HAMi's card type is that name, with ``NVIDIA-``
before it only where it does not start with ``NVIDIA``), its memory in MiB, its NUMA
node, its NVLinks (a card without NVLink may answer NOT_SUPPORTED or list inactive links),
its compute capability.
"""

from __future__ import annotations

from typing import Any

import pynvml

from agent.mig.tables import table_for
from agent.vendors.nvidia.nvml import NvmlSource, sysfs_bus_id
from agent.vendors.nvidia.simulated import PROFILES, profile_cards
from common.core.vendors import NVIDIA
from common.wire import ReportedCard
from tests.gpu.machine import (
    SMI_ERRORS,
    Topology,
    gpu_marks,
    parse_topology,
    query_cards,
    smi,
    sysfs_numa,
)
from tests.gpu.report import CheckLog

pytestmark = gpu_marks()


def _card(card: ReportedCard) -> dict[str, Any]:
    return {"index": card.index, "uuid": card.uuid, "type": card.type, "memory": card.memory,
            "numa": card.numa, "links": card.links, "sm_count": card.sm_count,
            "health": card.health, "health_detail": card.health_detail,
            "processes": card.processes, "process_memory": card.process_memory}


def _link_states(handle: object) -> dict[str, int]:
    """How each of the library's NVLink slots answers: what the stand-in must mimic for a
    card like this one (NOT_SUPPORTED throughout, inactive links, active ones)."""
    states: dict[str, int] = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = "active" if pynvml.nvmlDeviceGetNvLinkState(handle, link) else "inactive"
        except pynvml.NVMLError as error:
            state = f"error {type(error).__name__}"
        states[state] = states.get(state, 0) + 1
    return states


def _twin(model: str) -> tuple[str, ReportedCard] | None:
    """The simulated profile whose cards are of ``model``, and one of its cards."""
    for profile in sorted(PROFILES):
        for card in profile_cards(profile, "twin"):
            if card.type == model:
                return profile, card
    return None


def _topology(seen: CheckLog) -> Topology | None:
    try:
        text = smi("topo", "-m")
    except SMI_ERRORS as error:
        seen.saw("topo_error", str(error))
        return None
    seen.saw("topo", text.splitlines())
    return parse_topology(text)


def test_the_agents_nvml_inventory_is_nvidia_smis(seen: CheckLog) -> None:
    source = NvmlSource()
    source.open()
    try:
        cards = source.read()
    finally:
        source.close()
    smi_cards, unasked = query_cards()
    seen.saw("agent", [_card(card) for card in cards])
    seen.saw("nvidia_smi", [vars(card) for card in smi_cards])
    if unasked:
        seen.saw("nvidia_smi_unasked", unasked)
    seen.compare("the cards' UUIDs", sorted(c.uuid for c in cards),
                 sorted(c.uuid for c in smi_cards))
    topology = _topology(seen)
    index_of = {card.uuid: card.index for card in cards}
    by_uuid = {card.uuid: card for card in smi_cards}
    pynvml.nvmlInit()
    try:
        for card in cards:
            witness = by_uuid.get(card.uuid)
            if witness is None:
                continue
            gpu = f"GPU {card.index}"
            handle = pynvml.nvmlDeviceGetHandleByUUID(card.uuid)
            seen.saw(f"{gpu} nvlink_states", _link_states(handle))
            seen.compare(f"{gpu} index", card.index, witness.index)
            seen.compare(f"{gpu} type", card.type, NVIDIA.card_type(witness.name))
            seen.compare(f"{gpu} memory (MiB)", card.memory, witness.memory_mib)
            bus_id = sysfs_bus_id(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            seen.compare(f"{gpu} PCI bus id", bus_id, sysfs_bus_id(witness.bus_id))
            sysfs = sysfs_numa(bus_id)
            seen.saw(f"{gpu} sysfs numa_node", sysfs)
            if sysfs is not None and sysfs >= 0:
                # sysfs -1 is no affinity: on a host of one NUMA node the agent says 0, as
                # nvidia-smi does (compared below).
                seen.compare(f"{gpu} NUMA node", card.numa, sysfs, theirs_name="sysfs")
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            seen.saw(f"{gpu} compute capability", f"{major}.{minor}")
            if witness.compute_cap is not None:
                seen.compare(f"{gpu} compute capability", f"{major}.{minor}",
                             witness.compute_cap, ours_name="NVML")
            if not card.health:
                seen.differs(f"{gpu} reported unhealthy: {card.health_detail}")
            if card.links is None:
                seen.differs(f"{gpu} NVLinks unknown (a link read failed; see the log)")
            elif topology is not None:
                peers = {index_of[peer]: lanes for peer, lanes in card.links.items()
                         if peer in index_of}
                seen.compare(f"{gpu} NVLink peers (index: links)", peers,
                             topology.nvlinks.get(witness.index, {}),
                             theirs_name="nvidia-smi topo -m")
            cell = topology.numa.get(witness.index) if topology is not None else None
            if cell is not None and (cell.isdigit() or cell == "N/A"):
                seen.compare(f"{gpu} NUMA node", card.numa,
                             int(cell) if cell.isdigit() else -1,
                             theirs_name="nvidia-smi topo -m")
            _compare_with_the_stand_ins(seen, gpu, card, witness.name)
    finally:
        pynvml.nvmlShutdown()
    seen.assert_same()


def _compare_with_the_stand_ins(seen: CheckLog, gpu: str, card: ReportedCard,
                                name: str) -> None:
    """The simulated node of this model and the MIG table of this NVML ``name`` must hold
    what the real card reports, or the tests without a GPU tell something untrue."""
    twin = _twin(card.type)
    if twin is None:
        seen.saw(f"{gpu} simulated twin", f"no simulated profile has {card.type}")
    else:
        profile, simulated = twin
        seen.saw(f"{gpu} simulated twin", f"sim:{profile}")
        for field in ("memory", "sm_count"):
            seen.compare(f"{gpu} {field}", getattr(simulated, field), getattr(card, field),
                         ours_name=f"sim:{profile}", theirs_name="NVML")
    table = table_for(name)
    if table is not None:
        seen.compare(f"{gpu} memory (MiB)", table.memory_mib, card.memory,
                     ours_name=f"agent/mig/tables.py {table.name}", theirs_name="NVML")
