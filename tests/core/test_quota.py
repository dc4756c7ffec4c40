"""ResourceQuota in the decision core: reading a quota, which pods its scopes select, the
book of charges, and what a pod is charged. Every figure is worked out by hand."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from common.core import Allocation, CardGrant, Defaults, Usage, decide, parse_pod
from common.core.pod import (
    Container,
    ObjectMeta,
    PodManifest,
    PodSpec,
    QuotaSubject,
    ResourceRequirements,
)
from common.core.quota import (
    Quota,
    QuotaBook,
    QuotaLeft,
    QuotaRefusal,
    QuotaRejected,
    QuotaStanding,
    ResourceQuotaManifest,
    Scope,
    ScopeRule,
    parse_quota,
    requested_charge,
)
from pyhami.sandbox import DEFAULTS
from tests.builders import fleet_of, gpu_limits, hold, manifest, node

MEMORY = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"
WHERE = "ResourceQuota team-a/gpu-quota"


def quota_manifest(hard: dict[str, Any] | None = None, **spec: Any) -> ResourceQuotaManifest:
    """``team-a/gpu-quota`` as kubectl prints it, with these ``spec.hard`` and other spec
    fields (camelCase, as in the manifest)."""
    document = {"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"namespace": "team-a", "name": "gpu-quota",
                             "resourceVersion": "41"},
                "spec": {"hard": hard or {}, **spec},
                "status": {"hard": hard or {}, "used": {}}}
    return msgspec.convert(document, ResourceQuotaManifest)


def selector(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"scopeSelector": {"matchExpressions": list(expressions)}}


def memory_limit(value: Any) -> int | None:
    return parse_quota(quota_manifest({MEMORY: value})).memory


class TestParseQuota:
    @pytest.mark.parametrize(
        ("value", "mib"),
        [
            (4000, 4000),
            ("4000", 4000),
            # The API server hands 4000 back as 4k.
            ("4k", 4000),
            ("4e3", 4000),
            # A binary suffix is a whole number too, read as that many MiB, as a pod's
            # gpumem is (and as HAMi's AsInt64 reads it): 16 x 2^30.
            ("16Gi", 17179869184),
            # 0 blocks every charge; it is not "no limit".
            (0, 0),
            (2**53, 2**53),
        ],
        ids=["integer", "text", "4k", "exponent", "16Gi-is-mib", "zero", "2^53"],
    )
    def test_valid_memory_limits(self, value: Any, mib: int) -> None:
        assert memory_limit(value) == mib

    @pytest.mark.parametrize(
        ("value", "problem"),
        [
            ("1.5", "'1.5' is not an integer"),
            (1.5, "1.5 is not an integer"),
            ("1500m", "'1500m' is not an integer"),
            ("-1", "'-1' is a negative number"),
            (-1, "-1 is a negative number"),
            (2**53 + 1, "9007199254740993 is above 2^53 (9007199254740992)"),
            ("junk", "'junk' is not a quantity"),
            ("", "'' is not a quantity"),
        ],
        ids=["decimal-text", "decimal-number", "milli", "negative-text", "negative-number",
             "2^53+1", "junk", "empty"],
    )
    def test_invalid_memory_limits_are_refused_naming_quota_and_key(
            self, value: Any, problem: str) -> None:
        with pytest.raises(QuotaRejected) as refused:
            memory_limit(value)
        assert str(refused.value) == f"{WHERE}: spec.hard[{MEMORY}]: {problem}"

    def test_the_cores_limit_and_the_other_keys(self) -> None:
        quota = parse_quota(quota_manifest({CORES: "200", "pods": "10",
                                            "requests.nvidia.com/gpumem": "1",
                                            "limits.nvidia.com/gpumem-percentage": "50"}))
        # Only limits.nvidia.com/gpumem and gpucores are read, as HAMi reads them.
        assert quota == Quota("team-a", "gpu-quota", memory=None, cores=200)
        assert quota.limits_gpu

    def test_a_quota_of_other_resources_limits_no_gpu(self) -> None:
        assert not parse_quota(quota_manifest({"pods": "10"})).limits_gpu

    def test_a_bad_cores_limit_is_named(self) -> None:
        with pytest.raises(QuotaRejected, match=r"spec.hard\[limits.nvidia.com/gpucores\]: "
                                                 "'lots' is not a quantity"):
            parse_quota(quota_manifest({CORES: "lots"}))

    def test_no_namespace_is_the_default_one(self) -> None:
        manifest = msgspec.convert({"metadata": {"name": "q"}}, ResourceQuotaManifest)
        assert parse_quota(manifest).key == "default/q"

    @pytest.mark.parametrize(
        ("metadata", "problem"),
        [
            ({"name": "Gpu_Quota", "namespace": "team-a"},
             "ResourceQuota 'team-a/Gpu_Quota': metadata.name: 'Gpu_Quota' is not a valid "
             "DNS-1123 subdomain"),
            ({"name": "", "namespace": "team-a"},
             "ResourceQuota 'team-a/': metadata.name: must not be empty"),
            ({"name": "q", "namespace": "team.a"},
             "ResourceQuota 'team.a/q': metadata.namespace: 'team.a' is not a valid "
             "DNS-1123 label"),
        ],
        ids=["name-with-capitals", "no-name", "namespace-with-a-dot"],
    )
    def test_bad_names(self, metadata: dict[str, str], problem: str) -> None:
        manifest = msgspec.convert({"metadata": metadata}, ResourceQuotaManifest)
        with pytest.raises(QuotaRejected) as refused:
            parse_quota(manifest)
        assert str(refused.value).startswith(problem)

    @pytest.mark.parametrize(
        ("spec", "rules"),
        [
            ({"scopes": ["Terminating"]}, (ScopeRule(Scope.TERMINATING),)),
            ({"scopes": ["NotBestEffort", "PriorityClass"]},
             (ScopeRule(Scope.NOT_BEST_EFFORT), ScopeRule(Scope.PRIORITY_CLASS))),
            (selector({"scopeName": "PriorityClass", "operator": "In",
                       "values": ["high", "urgent"]}),
             (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high", "urgent"})),)),
            (selector({"scopeName": "PriorityClass", "operator": "NotIn", "values": ["low"]}),
             (ScopeRule(Scope.PRIORITY_CLASS, "NotIn", frozenset({"low"})),)),
            (selector({"scopeName": "PriorityClass", "operator": "Exists"}),
             (ScopeRule(Scope.PRIORITY_CLASS, "Exists"),)),
            (selector({"scopeName": "PriorityClass", "operator": "DoesNotExist"}),
             (ScopeRule(Scope.PRIORITY_CLASS, "DoesNotExist"),)),
            (selector({"scopeName": "NotTerminating", "operator": "Exists"}),
             (ScopeRule(Scope.NOT_TERMINATING),)),
            ({"scopes": ["BestEffort"],
              **selector({"scopeName": "Terminating", "operator": "Exists"})},
             (ScopeRule(Scope.BEST_EFFORT), ScopeRule(Scope.TERMINATING))),
        ],
        ids=["terminating", "two-scopes", "priority-in", "priority-not-in",
             "priority-exists", "priority-does-not-exist", "selector-not-terminating",
             "scopes-and-selector"],
    )
    def test_scopes_accepted(self, spec: dict[str, Any],
                             rules: tuple[ScopeRule, ...]) -> None:
        assert parse_quota(quota_manifest({MEMORY: 1}, **spec)).rules == rules

    @pytest.mark.parametrize(
        ("spec", "problem"),
        [
            ({"scopes": ["CrossNamespacePodAffinity"]},
             "spec.scopes[0]: 'CrossNamespacePodAffinity' is not a scope pyhami applies to "
             "GPU requests (one of Terminating, NotTerminating, BestEffort, NotBestEffort, "
             "PriorityClass)"),
            ({"scopes": ["Terminating", "NotTerminating"]},
             "scopes Terminating and NotTerminating exclude each other"),
            ({"scopes": ["BestEffort"],
              **selector({"scopeName": "NotBestEffort", "operator": "Exists"})},
             "scopes BestEffort and NotBestEffort exclude each other"),
            (selector({"scopeName": "PriorityClass", "operator": "In"}),
             "spec.scopeSelector.matchExpressions[0].values: operator In needs at least one "
             "value"),
            (selector({"scopeName": "PriorityClass", "operator": "NotIn", "values": []}),
             "spec.scopeSelector.matchExpressions[0].values: operator NotIn needs at least "
             "one value"),
            (selector({"scopeName": "PriorityClass", "operator": "Exists",
                       "values": ["high"]}),
             "spec.scopeSelector.matchExpressions[0].values: operator Exists takes no values"),
            (selector({"scopeName": "PriorityClass", "operator": "DoesNotExist",
                       "values": ["high"]}),
             "spec.scopeSelector.matchExpressions[0].values: operator DoesNotExist takes no "
             "values"),
            (selector({"scopeName": "PriorityClass", "operator": "Equals",
                       "values": ["high"]}),
             "spec.scopeSelector.matchExpressions[0].operator: 'Equals' is not one of In, "
             "NotIn, Exists, DoesNotExist"),
            (selector({"scopeName": "Terminating", "operator": "In", "values": ["x"]}),
             "spec.scopeSelector.matchExpressions[0]: scope Terminating takes operator "
             "Exists and no values"),
            (selector({"scopeName": "BestEffort", "operator": "DoesNotExist"}),
             "spec.scopeSelector.matchExpressions[0]: scope BestEffort takes operator Exists "
             "and no values"),
            (selector({"scopeName": "", "operator": "Exists"}),
             "spec.scopeSelector.matchExpressions[0].scopeName: '' is not a scope"),
            (selector({"scopeName": "PriorityClass", "operator": "In",
                       "values": [f"p{i}" for i in range(65)]}),
             "spec.scopeSelector.matchExpressions[0].values: 65 values (at most 64)"),
            ({"scopes": ["PriorityClass"] * 17}, "more than 16 scopes and scope expressions"),
        ],
        ids=["unknown-scope", "terminating-and-not", "best-effort-and-not-across",
             "in-without-values", "not-in-with-empty-values", "exists-with-values",
             "does-not-exist-with-values", "unknown-operator", "terminating-with-in",
             "best-effort-with-does-not-exist", "empty-scope-name", "too-many-values",
             "too-many-scopes"],
    )
    def test_scopes_refused(self, spec: dict[str, Any], problem: str) -> None:
        with pytest.raises(QuotaRejected) as refused:
            parse_quota(quota_manifest({MEMORY: 1}, **spec))
        assert str(refused.value).startswith(f"{WHERE}: {problem}")


HIGH = QuotaSubject("team-a", priority_class="high")
PLAIN = QuotaSubject("team-a")
TERMINATING = QuotaSubject("team-a", terminating=True)
BEST_EFFORT = QuotaSubject("team-a", best_effort=True)


class TestScopeRule:
    @pytest.mark.parametrize(
        ("rule", "pod", "matches"),
        [
            (ScopeRule(Scope.TERMINATING), TERMINATING, True),
            (ScopeRule(Scope.TERMINATING), PLAIN, False),
            (ScopeRule(Scope.NOT_TERMINATING), TERMINATING, False),
            (ScopeRule(Scope.NOT_TERMINATING), PLAIN, True),
            (ScopeRule(Scope.BEST_EFFORT), BEST_EFFORT, True),
            (ScopeRule(Scope.BEST_EFFORT), PLAIN, False),
            (ScopeRule(Scope.NOT_BEST_EFFORT), BEST_EFFORT, False),
            (ScopeRule(Scope.NOT_BEST_EFFORT), PLAIN, True),
            (ScopeRule(Scope.PRIORITY_CLASS), HIGH, True),
            (ScopeRule(Scope.PRIORITY_CLASS), PLAIN, False),
            (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high"})), HIGH, True),
            (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"low"})), HIGH, False),
            (ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high"})), PLAIN, False),
            (ScopeRule(Scope.PRIORITY_CLASS, "NotIn", frozenset({"high"})), HIGH, False),
            (ScopeRule(Scope.PRIORITY_CLASS, "NotIn", frozenset({"low"})), HIGH, True),
            # A pod without a priority class is "" to the selector: not in {high}.
            (ScopeRule(Scope.PRIORITY_CLASS, "NotIn", frozenset({"high"})), PLAIN, True),
            # Kubernetes' quirk: the selector's set always holds the priorityClass key,
            # so DoesNotExist never matches, not even a pod without a priority class.
            (ScopeRule(Scope.PRIORITY_CLASS, "DoesNotExist"), PLAIN, False),
            (ScopeRule(Scope.PRIORITY_CLASS, "DoesNotExist"), HIGH, False),
        ],
        ids=["terminating-deadline", "terminating-none", "not-terminating-deadline",
             "not-terminating-none", "best-effort-yes", "best-effort-no",
             "not-best-effort-yes", "not-best-effort-no", "priority-exists-set",
             "priority-exists-unset", "in-listed", "in-not-listed", "in-unset",
             "not-in-listed", "not-in-not-listed", "not-in-unset", "does-not-exist-unset",
             "does-not-exist-set"],
    )
    def test_matches(self, rule: ScopeRule, pod: QuotaSubject, matches: bool) -> None:
        assert rule.matches(pod) is matches

    @pytest.mark.parametrize(
        ("quota", "pod", "applies"),
        [
            (Quota("team-a", "q", memory=1), PLAIN, True),
            (Quota("team-b", "q", memory=1), PLAIN, False),
            # Every rule must match.
            (Quota("team-a", "q", memory=1, rules=(
                ScopeRule(Scope.PRIORITY_CLASS), ScopeRule(Scope.TERMINATING))), HIGH, False),
            (Quota("team-a", "q", memory=1, rules=(
                ScopeRule(Scope.PRIORITY_CLASS), ScopeRule(Scope.NOT_TERMINATING))),
             HIGH, True),
        ],
        ids=["same-namespace", "other-namespace", "one-rule-fails", "all-rules-match"],
    )
    def test_a_quota_applies_in_its_namespace_when_every_rule_matches(
            self, quota: Quota, pod: QuotaSubject, applies: bool) -> None:
        assert quota.applies_to(pod) is applies


def pod_manifest(*, priority_class: str | None = None, deadline: int | None = None,
                 requests: dict[str, Any] | None = None,
                 init_requests: dict[str, Any] | None = None) -> PodManifest:
    def container(name: str, extra: dict[str, Any] | None) -> Container:
        limits: dict[str, str | int | float] = {"nvidia.com/gpu": 1}
        return Container(name=name, resources=ResourceRequirements(
            limits=limits, requests=dict(extra) if extra else None))

    return PodManifest(
        metadata=ObjectMeta(name="p", namespace="team-a"),
        spec=PodSpec(containers=[container("main", requests)],
                     init_containers=[container("init", init_requests)]
                     if init_requests is not None else None,
                     priority_class_name=priority_class,
                     active_deadline_seconds=deadline))


class TestQuotaSubject:
    @pytest.mark.parametrize(
        ("manifest", "subject"),
        [
            (pod_manifest(), QuotaSubject("team-a", best_effort=True)),
            (pod_manifest(priority_class="high"),
             QuotaSubject("team-a", priority_class="high", best_effort=True)),
            (pod_manifest(deadline=0), QuotaSubject("team-a", terminating=True,
                                                    best_effort=True)),
            (pod_manifest(requests={"cpu": "500m"}), QuotaSubject("team-a")),
            (pod_manifest(requests={"memory": "1Gi"}), QuotaSubject("team-a")),
            # Zero requests leave the pod BestEffort.
            (pod_manifest(requests={"cpu": "0", "memory": 0}),
             QuotaSubject("team-a", best_effort=True)),
            (pod_manifest(init_requests={"cpu": "1"}), QuotaSubject("team-a")),
            # A GPU request alone does not make a QoS class.
            (pod_manifest(requests={"nvidia.com/gpu": 1}),
             QuotaSubject("team-a", best_effort=True)),
        ],
        ids=["nothing", "priority-class", "deadline-zero", "cpu-request", "memory-request",
             "zero-requests", "init-container-request", "gpu-request-only"],
    )
    def test_of_a_manifest(self, manifest: PodManifest, subject: QuotaSubject) -> None:
        assert QuotaSubject.of(manifest) == subject


def allocation(*containers: tuple[CardGrant, ...], init: int = 0,
               subject: QuotaSubject | None = None) -> Allocation:
    return Allocation("n", tuple(containers), init, subject)


def grant(uuid: str, memory: int, cores: int = 0) -> tuple[CardGrant, ...]:
    return (CardGrant(uuid, memory, cores),)


def book_of(*quotas: Quota) -> QuotaBook:
    book = QuotaBook()
    for quota in quotas:
        book.set_quota(quota)
    return book


def used(book: QuotaBook) -> dict[tuple[str, str, str], int]:
    """(namespace, quota, resource) -> used, for every quota the book holds."""
    return {(s.namespace, s.quota, s.resource): s.used for s in book.standings()}


GPU_QUOTA = Quota("team-a", "gpu-quota", memory=16384)


class TestQuotaBook:
    def test_charge_and_refund(self) -> None:
        book = book_of(GPU_QUOTA)
        book.charge("team-a/one", allocation(grant("A", 4000)))
        book.charge("team-a/two", allocation(grant("B", 3000)))
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 7000}
        assert book.left(PLAIN) == QuotaLeft(memory=9384, cores=None)
        book.refund("team-a/one")
        book.refund("team-a/one")  # a second refund changes nothing
        book.refund("team-a/never-charged")
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 3000}
        book.refund("team-a/two")
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 0}
        assert book.namespace_used() == {}

    def test_charging_a_pod_again_replaces_its_charge(self) -> None:
        book = book_of(GPU_QUOTA)
        book.charge("team-a/one", allocation(grant("A", 4000)))
        book.charge("team-a/one", allocation(grant("A", 1000)))
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 1000}

    def test_a_copy_is_independent(self) -> None:
        book = book_of(GPU_QUOTA)
        book.charge("team-a/one", allocation(grant("A", 4000)))
        copy = book.copy()
        copy.charge("team-a/two", allocation(grant("B", 3000)))
        copy.refund("team-a/one")
        copy.set_quota(Quota("team-a", "small", memory=100))
        copy.remove_quota("team-a", "gpu-quota")
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 4000}
        assert book.namespace_used() == {"team-a": Usage(1, 4000, 0)}
        assert used(copy) == {("team-a", "small", "nvidia.com/gpumem"): 3000}
        assert copy.namespace_used() == {"team-a": Usage(1, 3000, 0)}

    def test_a_namespaces_copy_holds_it_alone_and_is_independent(self) -> None:
        book = book_of(GPU_QUOTA, Quota("team-b", "other", memory=9000))
        book.charge("team-a/one", allocation(grant("A", 4000)))
        book.charge("team-b/two", allocation(grant("B", 3000)))
        mine = book.of_namespace("team-a")
        assert used(mine) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 4000}
        assert mine.namespace_used() == {"team-a": Usage(1, 4000, 0)}
        assert mine.left(PLAIN) == book.left(PLAIN)
        mine.refund("team-a/one")
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 4000,
                              ("team-b", "other", "nvidia.com/gpumem"): 3000}
        assert used(mine) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 0}

    def test_a_quota_set_after_the_pods_counts_them(self) -> None:
        book = QuotaBook()
        book.charge("team-a/one", allocation(grant("A", 4000, 30)))
        book.charge("team-a/two", allocation(grant("B", 3000, 20)))
        book.charge("team-b/other", allocation(grant("C", 5000, 50)))
        book.set_quota(Quota("team-a", "gpu-quota", memory=16384, cores=100))
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpucores"): 50,
                              ("team-a", "gpu-quota", "nvidia.com/gpumem"): 7000}
        # Replaced with a lower limit: counted afresh, and now exceeded.
        book.set_quota(Quota("team-a", "gpu-quota", memory=6000))
        assert book.left(PLAIN) == QuotaLeft(memory=-1000, cores=None)

    def test_a_quota_without_gpu_limits_is_not_kept(self) -> None:
        book = book_of(Quota("team-a", "pods"))
        assert book.quota("team-a", "pods") is None
        assert book.left(PLAIN) is None
        assert list(book.quotas()) == []

    def test_remove_and_replace(self) -> None:
        book = book_of(GPU_QUOTA, Quota("team-b", "b", cores=100))
        book.charge("team-a/one", allocation(grant("A", 4000)))
        assert book.remove_quota("team-a", "gpu-quota") == GPU_QUOTA
        assert book.remove_quota("team-a", "gpu-quota") is None
        assert book.left(PLAIN) is None
        book.replace_quotas([Quota("team-a", "again", memory=5000)])
        assert [q.key for q in book.quotas()] == ["team-a/again"]
        assert book.left(PLAIN) == QuotaLeft(memory=1000, cores=None)

    @pytest.mark.parametrize(
        ("quotas", "left"),
        [
            # used 2000: big leaves 8000, small 4000: the tighter wins.
            ((Quota("team-a", "big", memory=10000), Quota("team-a", "small", memory=6000)),
             QuotaLeft(memory=4000, cores=None)),
            ((Quota("team-a", "small", memory=6000), Quota("team-a", "big", memory=10000)),
             QuotaLeft(memory=4000, cores=None)),
            # Each resource from the quotas that limit it: cores 100 - 40.
            ((Quota("team-a", "memory", memory=10000), Quota("team-a", "cores", cores=100)),
             QuotaLeft(memory=8000, cores=60)),
            ((Quota("team-a", "both", memory=3000, cores=50),
              Quota("team-a", "memory", memory=10000)),
             QuotaLeft(memory=1000, cores=10)),
        ],
        ids=["tighter-second", "tighter-first", "one-resource-each", "both-and-memory"],
    )
    def test_two_quotas_the_tighter_wins_in_left(self, quotas: tuple[Quota, ...],
                                                 left: QuotaLeft) -> None:
        book = book_of(*quotas)
        book.charge("team-a/one", allocation(grant("A", 2000, 40)))
        assert book.left(PLAIN) == left

    @pytest.mark.parametrize(
        ("asked", "refusal"),
        [
            # 2000 + 4000 = 6000: both hold.
            (Usage(0, 4000, 0), None),
            # 2000 + 4001: small (6000) is exceeded, big (10000) is not.
            (Usage(0, 4001, 0), QuotaRefusal("team-a", "small", "nvidia.com/gpumem",
                                             2000, 4001, 6000, " MiB")),
            # 2000 + 9000: both exceeded; small the most (by 5000 against 1000).
            (Usage(0, 9000, 0), QuotaRefusal("team-a", "small", "nvidia.com/gpumem",
                                             2000, 9000, 6000, " MiB")),
            # 40 + 70 cores > 100.
            (Usage(0, 1000, 70), QuotaRefusal("team-a", "cores", "nvidia.com/gpucores",
                                              40, 70, 100)),
        ],
        ids=["fits", "small-exceeded", "both-exceeded-small-most", "cores"],
    )
    def test_refusal_names_the_quota_exceeded_the_most(
            self, asked: Usage, refusal: QuotaRefusal | None) -> None:
        book = book_of(Quota("team-a", "big", memory=10000),
                       Quota("team-a", "small", memory=6000),
                       Quota("team-a", "cores", cores=100))
        book.charge("team-a/one", allocation(grant("A", 2000, 40)))
        assert book.refusal(PLAIN, asked) == refusal

    def test_on_a_tie_the_first_name_is_refused(self) -> None:
        book = book_of(Quota("team-a", "zeta", memory=1000), Quota("team-a", "alpha",
                                                                   memory=1000))
        refusal = book.refusal(PLAIN, Usage(0, 1500, 0))
        assert refusal is not None and refusal.quota == "alpha"

    @pytest.mark.parametrize(
        ("refusal", "text"),
        [
            (QuotaRefusal("team-a", "gpu-quota", "nvidia.com/gpumem", 14000, 4000, 16384,
                          " MiB"),
             "team-a would use 18000 of 16384 MiB nvidia.com/gpumem under ResourceQuota "
             "gpu-quota (asked 4000)"),
            (QuotaRefusal("team-a", "cores", "nvidia.com/gpucores", 60, 60, 100),
             "team-a would use 120 of 100 nvidia.com/gpucores under ResourceQuota cores "
             "(asked 60)"),
        ],
        ids=["memory-in-mib", "cores-without-unit"],
    )
    def test_the_sentence(self, refusal: QuotaRefusal, text: str) -> None:
        assert refusal.text() == text

    def test_a_scoped_quota_charges_only_the_pods_it_selects(self) -> None:
        high_only = Quota("team-a", "high", memory=8000, rules=(
            ScopeRule(Scope.PRIORITY_CLASS, "In", frozenset({"high"})),))
        book = book_of(high_only, GPU_QUOTA)
        book.charge("team-a/urgent", allocation(grant("A", 4000), subject=HIGH))
        book.charge("team-a/plain", allocation(grant("B", 3000), subject=PLAIN))
        # A ledger entry that knows only its key: its namespace, no priority class.
        book.charge("team-a/unknown", allocation(grant("C", 1000)))
        assert used(book) == {("team-a", "gpu-quota", "nvidia.com/gpumem"): 8000,
                              ("team-a", "high", "nvidia.com/gpumem"): 4000}
        assert book.left(HIGH) == QuotaLeft(memory=4000, cores=None)  # 8000 - 4000
        assert book.left(PLAIN) == QuotaLeft(memory=8384, cores=None)  # 16384 - 8000
        assert book.namespace_used() == {"team-a": Usage(3, 8000, 0)}
        book.refund("team-a/urgent")
        assert used(book)[("team-a", "high", "nvidia.com/gpumem")] == 0

    def test_standings_sorted_one_row_per_resource(self) -> None:
        book = book_of(Quota("team-b", "b", memory=100),
                       Quota("team-a", "z", memory=5000, cores=100),
                       Quota("team-a", "a", cores=300))
        book.charge("team-a/one", allocation(grant("A", 2000, 40)))
        assert book.standings() == [
            QuotaStanding("team-a", "a", "nvidia.com/gpucores", 40, 300),
            QuotaStanding("team-a", "z", "nvidia.com/gpucores", 40, 100),
            QuotaStanding("team-a", "z", "nvidia.com/gpumem", 2000, 5000),
            QuotaStanding("team-b", "b", "nvidia.com/gpumem", 0, 100),
        ]

    def test_namespace_used_counts_namespaces_with_and_without_quotas(self) -> None:
        book = book_of(GPU_QUOTA)
        book.charge("team-a/one", allocation(grant("A", 2000, 40)))
        book.charge("team-c/one", allocation(grant("A", 1000, 10), grant("B", 500, 0)))
        assert book.namespace_used() == {"team-a": Usage(1, 2000, 40),
                                         "team-c": Usage(2, 1500, 10)}
        book.refund("team-c/one")
        assert book.namespace_used() == {"team-a": Usage(1, 2000, 40)}


def request(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
            defaults: Defaults = DEFAULTS) -> Any:
    def build(specs: list[dict[str, Any]], prefix: str) -> list[Container]:
        return [Container(name=f"{prefix}{i}", resources=ResourceRequirements(limits=spec))
                for i, spec in enumerate(specs)]

    manifest = PodManifest(metadata=ObjectMeta(name="p", namespace="team-a"),
                           spec=PodSpec(containers=build(containers, "c"),
                                        init_containers=build(init or [], "init")))
    return parse_pod(manifest, defaults)




class TestRequestedCharge:
    @pytest.mark.parametrize(
        ("containers", "init", "card_memory", "charge"),
        [
            ([gpu_limits(3000), gpu_limits(2000)], None, None, Usage(0, 5000, 0)),
            ([gpu_limits(3000, cards=2)], None, None, Usage(0, 6000, 0)),
            # Init at its peak against the app sum: 6000 > 3000 + 2000.
            ([gpu_limits(3000), gpu_limits(2000)], [gpu_limits(6000)], None, Usage(0, 6000, 0)),
            # 4000 < 5000: the app sum.
            ([gpu_limits(3000), gpu_limits(2000)], [gpu_limits(4000)], None, Usage(0, 5000, 0)),
            # Two init containers: the larger one, not their sum.
            ([gpu_limits(1000)], [gpu_limits(4000), gpu_limits(3000)], None, Usage(0, 4000, 0)),
            ([gpu_limits(1000, cores=30), gpu_limits(1000, cores=40)],
             [gpu_limits(1000, cores=100)], None, Usage(0, 2000, 100)),
            ([gpu_limits(1000, cores=30, cards=2)], None, None, Usage(0, 2000, 60)),
            # A percentage counts on a card of the size given: 25% of 16384.
            ([gpu_limits(percent=25)], None, 16384, Usage(0, 4096, 0)),
            ([gpu_limits(percent=25, cards=2)], None, 16384, Usage(0, 8192, 0)),
            # At admission no card is chosen: 0, as HAMi charges it.
            ([gpu_limits(percent=25)], None, None, Usage(0, 0, 0)),
            ([gpu_limits(percent=25), gpu_limits(1000)], None, None, Usage(0, 1000, 0)),
        ],
        ids=["apps-summed", "cards-multiply", "init-above-apps", "apps-above-init",
             "init-peak-not-sum", "cores-init-peak", "cores-cards-multiply",
             "percentage-on-a-card", "percentage-two-cards", "percentage-at-admission",
             "percentage-and-fixed-at-admission"],
    )
    def test_requested_charge(self, containers: list[dict[str, Any]],
                              init: list[dict[str, Any]] | None, card_memory: int | None,
                              charge: Usage) -> None:
        assert requested_charge(request(containers, init), card_memory) == charge


class TestAllocationCharge:
    @pytest.mark.parametrize(
        ("containers", "init", "charge"),
        [
            # One card: init 6000 against apps 3000 + 2000: 6000, two app tenants.
            ((grant("A", 6000), grant("A", 3000), grant("A", 2000)), 1, Usage(2, 6000, 0)),
            ((grant("A", 4000), grant("A", 3000), grant("A", 2000)), 1, Usage(2, 5000, 0)),
            # Per card: A max(4000, 3000), B 3000: 7000, more than the pod-wide
            # max(4000, 6000) that requested_charge gives.
            ((grant("A", 4000), grant("A", 3000), grant("B", 3000)), 1, Usage(2, 7000, 0)),
            # Init on a card no app container uses: charged there at its own size.
            ((grant("A", 4000), grant("B", 3000)), 1, Usage(2, 7000, 0)),
            # Cores the same way: A max(100, 30 + 30), B 30.
            ((grant("A", 0, 100), grant("A", 0, 30), grant("A", 0, 30), grant("B", 0, 30)),
             1, Usage(3, 0, 130)),
            # No init container: everything summed.
            ((grant("A", 4000), grant("A", 3000)), 0, Usage(2, 7000, 0)),
            # A multi-card container: each card charged.
            (((CardGrant("A", 2000, 10), CardGrant("B", 2000, 10)),), 0, Usage(2, 4000, 20)),
        ],
        ids=["init-above-apps-one-card", "apps-above-init-one-card",
             "init-shares-one-of-two-cards", "init-alone-on-its-card", "cores-per-card",
             "no-init", "multi-card-container"],
    )
    def test_charge(self, containers: tuple[tuple[CardGrant, ...], ...], init: int,
                    charge: Usage) -> None:
        assert allocation(*containers, init=init).charge() == charge


class TestExceededQuota:
    """A quota already past its limit (lowered below its use) refuses what adds to it, and
    only that: Kubernetes checks the resources a pod asks for."""

    @pytest.mark.parametrize(("asked", "placed"), [
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10}, True),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10, "nvidia.com/gpucores": 1}, False),
    ], ids=["asking-no-cores-is-placed", "asking-one-core-is-refused"])
    def test_an_exceeded_cores_quota(self, asked: dict[str, Any], placed: bool) -> None:
        fleet = fleet_of(node("n", 2))
        hold(fleet, "default/old", "n", "GPU-n-0", memory=1000, cores=60)
        fleet.quotas.set_quota(Quota("default", "q", cores=50))
        decision = decide(fleet, parse_pod(manifest(containers=[asked]), DEFAULTS),
                          describe=True)
        assert (decision.node is not None) is placed
        if not placed:
            assert decision.message is not None
            assert decision.message.startswith(
                "default would use 61 of 50 nvidia.com/gpucores under ResourceQuota q "
                "(asked 1)")
