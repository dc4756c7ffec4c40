"""HAMi's priority feedback loop: the pure decision for two and three priorities, and the
writes into real cache files, skipped when the file changed since it was read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.monitor.cache import V0, V1
from agent.monitor.containers import Allocation, CacheSettings, ContainerCaches
from agent.monitor.feedback import Control, Writes, decide
from tests.fakes.hami_core_cache import FakeCache, gpu_uuid, read_int32, write_cache

A = gpu_uuid(0).decode()
B = gpu_uuid(1).decode()
POD = "0b6f9a52-6f4e-4c1e-9d2a-000000000001"


def c(priority: int, recent: int, switch: int = 1, cards: tuple[str, ...] = (A,)) -> Control:
    return Control(priority=priority, recent_kernel=recent, utilization_switch=switch,
                   cards=cards)


def w(recent: int | None = None, switch: int | None = None) -> Writes:
    return Writes(recent_kernel=recent, utilization_switch=switch)


@pytest.mark.parametrize(("controls", "expected"), [
    # Two priorities on one card.
    ([c(0, 2), c(1, 2)], [w(1, 0), w(-1)]),
    ([c(0, 0), c(1, 2)], [w(None, 0), w(1, 0)]),
    ([c(0, 1), c(1, 2)], [w(0, 0), w(1, 0)]),
    ([c(0, 2), c(1, 2, cards=(B,))], [w(1, 0), w(1, 0)]),
    ([c(0, 2), c(1, -1)], [w(1, 0), w()]),
    ([c(0, 0), c(1, -1)], [w(None, 0), w(0, 0)]),
    ([c(0, 2, switch=0), c(1, 0, switch=0)], [w(1), w(-1, 1)]),
    # Three priorities.
    ([c(0, 2, 0), c(1, 2, 0), c(2, 2, 0)], [w(1), w(-1, 1), w(-1, 1)]),
    ([c(0, 0, 0), c(1, 2, 0), c(2, 2, 0)], [w(), w(1), w(-1, 1)]),
    ([c(0, 2, 0, (A,)), c(1, 2, 0, (B,)), c(2, 2, 0, (A, B))],
     [w(1), w(1), w(-1, 1)]),
    ([c(0, 0, 0), c(1, 0, 0), c(2, -1, 0)], [w(), w(), w(0)]),
    # One priority: the switch says whether another container at it is busy.
    ([c(1, 2, 0), c(1, 2, 0)], [w(1, 1), w(1, 1)]),
    ([c(1, 2, 1)], [w(1, 0)]),
    ([c(1, 2, 0), c(1, 1, 0)], [w(1), w(0)]),
    # Priorities below 0 are never counted busy.
    ([c(-1, 2), c(0, 2)], [w(1, 0), w(1, 0)]),
], ids=["two-high-busy-pauses-low", "two-high-idle", "two-high-counts-down-to-idle",
        "two-other-card", "two-paused-stays", "two-paused-released", "two-idle-low-paused",
        "three-all-busy", "three-top-idle-middle-pauses-bottom", "three-across-cards",
        "three-all-idle-released", "same-priority-both-busy", "same-priority-alone",
        "same-priority-one-counting-down", "negative-priority-not-counted"])
def test_the_loop_decides_as_hami(controls: list[Control], expected: list[Writes]) -> None:
    assert decide(controls) == expected


def test_a_card_named_twice_counts_twice_as_in_hami() -> None:
    assert decide([c(1, 2, 0, (A, A))]) == [w(1, 1)]


# --- writes into real files -----------------------------------------------------------

GIVEN = {(POD, name): Allocation("lab/pod", frozenset({A}))
         for name in ("high", "low", "p0", "p1", "p2")}
"""Every container below was given card A, the one its file names."""


def two_priorities(root: Path, layout: str = "v1") -> tuple[Path, Path]:
    high = write_cache(root / f"{POD}_high" / "a.cache",
                       FakeCache(layout=layout, priority=0,  # type: ignore[arg-type]
                                 recent_kernel=2, uuids={0: gpu_uuid(0)}))
    low = write_cache(root / f"{POD}_low" / "a.cache",
                      FakeCache(layout=layout, priority=1,  # type: ignore[arg-type]
                                recent_kernel=2, uuids={0: gpu_uuid(0)}))
    return high, low


def fields(path: Path, layout: str) -> tuple[int, int]:
    at = V1 if layout == "v1" else V0
    return read_int32(path, at.recent_kernel), read_int32(path, at.utilization_switch)


@pytest.mark.parametrize("layout", ["v1", "v0"])
def test_a_paused_container_is_released_when_the_higher_goes_idle(tmp_path: Path,
                                                                  layout: str) -> None:
    high, low = two_priorities(tmp_path, layout)
    lister = ContainerCaches(CacheSettings(containers_dir=tmp_path))
    first = lister.feedback(lister.scan(allocations=GIVEN))
    assert (fields(high, layout), fields(low, layout)) == ((1, 0), (-1, 1))
    assert first.written == (f"{POD}_high", f"{POD}_low")
    assert first.paused == (f"{POD}_low",)
    # The high one launches nothing more: its count reaches 0, the low one is let go.
    second = lister.feedback(lister.scan(allocations=GIVEN))
    assert (fields(high, layout), fields(low, layout)) == ((0, 0), (0, 0))
    assert second.paused == ()
    # Nothing changes: nothing is written.
    assert lister.feedback(lister.scan(allocations=GIVEN)).written == ()


def test_three_priorities_written_into_their_files(tmp_path: Path) -> None:
    paths = [write_cache(tmp_path / f"{POD}_p{p}" / "a.cache",
                         FakeCache(priority=p, recent_kernel=2, utilization_switch=0,
                                   uuids={0: gpu_uuid(0)}))
             for p in range(3)]
    lister = ContainerCaches(CacheSettings(containers_dir=tmp_path))
    result = lister.feedback(lister.scan(allocations=GIVEN))
    assert [fields(path, "v1") for path in paths] == [(1, 0), (-1, 1), (-1, 1)]
    assert result.paused == (f"{POD}_p1", f"{POD}_p2")


@pytest.mark.parametrize("change", ["replaced", "resized", "magic"])
def test_a_file_changed_since_the_scan_is_not_written(tmp_path: Path, change: str) -> None:
    high, low = two_priorities(tmp_path)
    lister = ContainerCaches(CacheSettings(containers_dir=tmp_path))
    scan = lister.scan(allocations=GIVEN)
    held = low.open("rb")  # as the container's processes hold the old file mapped
    if change == "replaced":
        low.unlink()
        write_cache(low, FakeCache(priority=1, recent_kernel=2, uuids={0: gpu_uuid(0)}))
    elif change == "resized":
        os.truncate(low, V1.size + 64)
    else:
        with low.open("r+b") as file:
            file.write(b"\0\0\0\0")
    result = lister.feedback(scan)
    held.close()
    assert result.skipped == {"changed": 1}
    assert fields(low, "v1") == (2, 1)  # untouched
    assert fields(high, "v1") == (1, 0)  # alone now: counted down, switch off
    assert lister.skipped["changed"] == 1
