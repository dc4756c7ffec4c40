"""The webhook's quota check: a new pod's fixed requests against what its namespace's
quotas leave, before any card is chosen."""

from __future__ import annotations

import pytest

from common.core import parse_pod
from common.core.quota import Quota, QuotaBook, admission_denial
from pyhami.sandbox import DEFAULTS
from tests.builders import manifest

MEM = "nvidia.com/gpumem"
PERCENT = "nvidia.com/gpumem-percentage"


def book_with(*quotas: Quota) -> QuotaBook:
    book = QuotaBook()
    for quota in quotas:
        book.set_quota(quota)
    return book


@pytest.mark.parametrize(("containers", "init_containers", "quota", "sentence"), [
    ([{"nvidia.com/gpu": 1, MEM: 4000}], [], Quota("default", "q", memory=4000), None),
    ([{"nvidia.com/gpu": 1, MEM: 4001}], [], Quota("default", "q", memory=4000),
     "default would use 4001 of 4000 MiB nvidia.com/gpumem under ResourceQuota q "
     "(asked 4001)"),
    ([{"nvidia.com/gpu": 2, MEM: 2500}], [], Quota("default", "q", memory=4000),
     "default would use 5000 of 4000 MiB nvidia.com/gpumem under ResourceQuota q "
     "(asked 5000)"),
    ([{"nvidia.com/gpu": 1, MEM: 1000}, {"nvidia.com/gpu": 1, MEM: 1000}],
     [{"nvidia.com/gpu": 1, MEM: 3000}], Quota("default", "q", memory=2999),
     "default would use 3000 of 2999 MiB nvidia.com/gpumem under ResourceQuota q "
     "(asked 3000)"),
    ([{"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}], [],
     Quota("default", "q", memory=0), None),
    ([{"nvidia.com/gpu": 2, MEM: 10, "nvidia.com/gpucores": 60}], [],
     Quota("default", "q", cores=100),
     "default would use 120 of 100 nvidia.com/gpucores under ResourceQuota q (asked 120)"),
    ([{"nvidia.com/gpu": 1, MEM: 5000}], [], Quota("other", "q", memory=10), None),
], ids=["fits-exactly", "one-mib-over", "cards-multiply", "init-at-its-peak-over-app-sum",
        "percentage-is-judged-at-filter-time", "cores", "another-namespace"])
def test_fixed_requests_are_judged_at_admission(
        containers: list[dict[str, int | str]], init_containers: list[dict[str, int | str]],
        quota: Quota, sentence: str | None) -> None:
    pod = parse_pod(manifest(containers=containers, init_containers=init_containers), DEFAULTS)
    refusal = admission_denial(book_with(quota), pod)
    assert (None if refusal is None else refusal.text()) == sentence


def test_a_pod_asking_for_nothing_chargeable_is_never_refused() -> None:
    # A share of memory counts 0 at admission, and no cores are asked.
    pod = parse_pod(manifest(containers=[{"nvidia.com/gpu": 1, PERCENT: 50}]),
                    DEFAULTS)
    assert admission_denial(book_with(Quota("default", "q", memory=0, cores=0)), pod) is None
