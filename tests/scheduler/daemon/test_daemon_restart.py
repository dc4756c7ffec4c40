"""Restarting the daemon mid-run: the ledger comes back from the pods' annotations."""

from __future__ import annotations

from common.core import Usage
from pyhami.demo import lab_pod
from pyhami.sandbox import RunningDaemon
from tests.harness import Lab, card_of

GPU = [f"GPU-gpu-node-1-{i}" for i in range(4)]


def ledger(daemon: RunningDaemon) -> dict[str, Usage]:
    assert daemon.service is not None
    fleet = daemon.service.state.fleet
    return {uuid: fleet.usage("gpu-node-1", uuid) for uuid in GPU}


async def test_a_restart_keeps_the_ledger_and_the_pending_pods(lab: Lab) -> None:
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    await lab.pods.submit_and_place(lab_pod("a", binpack))
    await lab.pods.submit_and_place(lab_pod("b", binpack, limits={
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 20}))
    for i in range(1, 4):
        await lab.pods.submit_and_place(lab_pod(f"fill-{i}", {
            "nvidia.com/use-gpuuuid": GPU[i]}))
    await lab.pods.submit(lab_pod("mutex", {"hami.io/gpu-scheduler-policy": "mutex"}))
    await lab.pods.pending_with("mutex", "FilteringFailed")
    before = ledger(lab.daemon)
    assert before[GPU[0]] == Usage(tenants=2, memory=4000, cores=20)

    await lab.restart_daemon()

    assert ledger(lab.daemon) == before
    pods = {p["name"]: p for p in await lab.pods.pods()}
    assert pods["mutex"]["node"] is None
    assert all(pods[n]["node"] == "gpu-node-1" for n in ("a", "b", "fill-1", "fill-2", "fill-3"))
    # Nothing is booked twice: the next binpack pod stacks on GPU 0 with the rest.
    await lab.pods.submit_and_place(lab_pod("c", binpack))
    assert lab.daemon.service is not None
    assert lab.daemon.service.state.fleet.usage("gpu-node-1", GPU[0]) == Usage(3, 5000, 20)
    # The pending mutex pod is still waiting, and still placed once a card frees up.
    await lab.pods.delete("fill-2")
    placed = await lab.pods.placed("mutex")
    assert card_of(placed["annotations"]["hami.io/vgpu-devices-allocated"]) == GPU[2]
