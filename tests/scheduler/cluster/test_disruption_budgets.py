"""Which pods a PodDisruptionBudget covers, as policy/v1 selects them: match labels and
expressions together, an empty selector the whole namespace, no selector nobody."""

from __future__ import annotations

import pytest

from scheduler.cluster import DisruptionBudget, LabelRequirement


def budget(*, labels: dict[str, str] | None = None,
           expressions: tuple[LabelRequirement, ...] = (), selected: bool = True,
           namespace: str = "team-a") -> DisruptionBudget:
    return DisruptionBudget(namespace=namespace, selected=selected,
                            match_labels=labels or {}, match_expressions=expressions,
                            disruptions_allowed=0)


@pytest.mark.parametrize(("covering", "labels", "expected"), [
    (budget(labels={"app": "train"}), {"app": "train", "tier": "gpu"}, True),
    (budget(labels={"app": "train"}), {"app": "serve"}, False),
    (budget(labels={"app": "train"}), {}, False),
    (budget(), {"anything": "at all"}, True),  # an empty selector: the whole namespace
    (budget(selected=False), {"app": "train"}, False),  # no selector: nobody
    (budget(expressions=(LabelRequirement("app", "In", ("train", "tune")),)),
     {"app": "tune"}, True),
    (budget(expressions=(LabelRequirement("app", "In", ("train",)),)), {}, False),
    (budget(expressions=(LabelRequirement("app", "NotIn", ("serve",)),)), {}, True),
    (budget(expressions=(LabelRequirement("app", "NotIn", ("serve",)),)),
     {"app": "serve"}, False),
    (budget(expressions=(LabelRequirement("gpu", "Exists"),)), {"gpu": ""}, True),
    (budget(expressions=(LabelRequirement("gpu", "DoesNotExist"),)), {"gpu": "x"}, False),
    (budget(labels={"app": "train"},
            expressions=(LabelRequirement("tier", "Exists"),)), {"app": "train"}, False),
    (budget(expressions=(LabelRequirement("gpu", "Gt", ("1",)),)), {"gpu": "2"}, False),
])
def test_a_budget_covers_the_pods_its_selector_selects(
        covering: DisruptionBudget, labels: dict[str, str], expected: bool) -> None:
    assert covering.covers("team-a", labels) is expected


def test_a_budget_covers_no_pod_of_another_namespace() -> None:
    assert not budget(namespace="team-a").covers("team-b", {})
