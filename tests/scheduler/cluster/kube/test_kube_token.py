"""The API token asked of the kubernetes package's refresh hook at most once a second."""

from __future__ import annotations

import pytest

from scheduler.cluster.kube._transport import CachedAuthorization


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("seconds_later", "reads"), [
    (0.0, 1),
    (0.999, 1),
    (1.0, 2),
    (30.0, 2),
])
def test_the_header_is_read_again_once_the_interval_has_passed(
        seconds_later: float, reads: int) -> None:
    clock = Clock()
    asked: list[int] = []

    def read() -> str:
        asked.append(1)
        return f"Bearer t{len(asked)}"

    authorization = CachedAuthorization(read, interval=1.0, clock=clock)
    assert authorization() == "Bearer t1"
    clock.now += seconds_later
    assert authorization() == f"Bearer t{reads}"
    assert len(asked) == reads


def test_forget_reads_the_header_again_at_once() -> None:
    clock = Clock()
    tokens = iter(["Bearer old", "Bearer new"])
    authorization = CachedAuthorization(lambda: next(tokens), clock=clock)
    assert authorization() == "Bearer old"
    authorization.forget()
    assert authorization() == "Bearer new"
    assert authorization() == "Bearer new"


def test_no_token_is_remembered_as_none() -> None:
    asked: list[int] = []

    def read() -> None:
        asked.append(1)

    authorization = CachedAuthorization(read, clock=Clock())
    assert authorization() is None
    assert authorization() is None
    assert len(asked) == 1
