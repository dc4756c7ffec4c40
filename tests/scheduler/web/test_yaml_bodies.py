"""The YAML bodies of the daemon's doors (``POST /api/pods`` and ``/explain``, which read a
Pod manifest, and ``/api/resourcequotas``): a key given twice and a merge key are refused
with one line, as ``kubectl`` refuses a duplicated field by default (``--validate=strict``)
(issue 45). A merge body that PyYAML before 6.0.4 expanded exponentially is refused at
once."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.files import InputFileError, json_keys_distinct, parse_pod_manifest
from scheduler.web.quotas import QuotaBodyError, read_quota
from tests.paths import EXAMPLES

POD_YAML = (EXAMPLES / "binpack-pod.yaml").read_text()
QUOTA_YAML = """\
apiVersion: v1
kind: ResourceQuota
metadata:
  name: gpu-quota
  namespace: team-a
spec:
  hard:
    limits.nvidia.com/gpumem: "4096"
"""


def nested_merges(levels: int) -> str:
    inner = "&a0 {k: v}"
    for level in range(1, levels + 1):
        inner = f"&a{level} {{<<: [{inner}, *a{level - 1}]}}"
    return f"x: {{<<: [{inner}, *a{levels}]}}\n"


def test_the_example_pod_is_read() -> None:
    assert parse_pod_manifest(POD_YAML, "request body").metadata.name == "plain-binpack"


def test_a_pod_giving_an_annotation_twice_is_refused_naming_it() -> None:
    body = POD_YAML.replace('    hami.io/gpu-scheduler-policy: "binpack"\n',
                            '    hami.io/gpu-scheduler-policy: "binpack"\n'
                            '    hami.io/gpu-scheduler-policy: "spread"\n')
    with pytest.raises(InputFileError) as refused:
        parse_pod_manifest(body, "request body")
    assert str(refused.value) == ("request body: metadata.annotations"
                                  "['hami.io/gpu-scheduler-policy'] is given twice "
                                  "(lines 6 and 7)")


def test_a_json_pod_giving_a_field_twice_is_refused_as_yaml_is() -> None:
    body = (b'{"kind": "Pod", "metadata": {"name": "a", "namespace": "team-a",\n'
            b'"name": "b"}}')
    with pytest.raises(InputFileError) as refused:
        parse_pod_manifest(body, "request body")
    assert str(refused.value) == "request body: metadata.name is given twice (lines 1 and 2)"


def test_a_json_pod_with_distinct_keys_takes_the_fast_path() -> None:
    body = json.dumps({"kind": "Pod", "metadata": {"name": "a", "namespace": "team-a",
                                                    "annotations": {"x": "1", "y": "1"}}})
    assert json_keys_distinct(body)
    assert parse_pod_manifest(body.encode(), "request body").metadata.name == "a"


@pytest.mark.parametrize(("text", "distinct"), [
    ('{"a": 1, "b": {"a": 1}}', True),
    ('{"a": 1, "a": 1}', False),
    ('[{"a": 1}, {"b": {"c": 1, "c": 2}}]', False),
    ('{"n": 1' + "0" * 5000 + "}", True),  # not converted: no 4,300-digit limit
    ("not json", False),  # cannot tell: the caller reads it as YAML
])
def test_json_keys_distinct(text: str, distinct: bool) -> None:
    assert json_keys_distinct(text) is distinct


def test_a_pod_with_a_merge_key_is_refused() -> None:
    body = POD_YAML + "extra: &e {a: 1}\nmore: {<<: *e}\n"
    with pytest.raises(InputFileError, match=r"^request body: not YAML or JSON: YAML merge "
                                             r"keys \(<<\) are not accepted"):
        parse_pod_manifest(body, "request body")


def test_the_exponential_merge_body_is_refused_at_once() -> None:
    body = nested_merges(24)  # 465 bytes; PyYAML 6.0.3 alone: 36 s, 670 MB
    with pytest.raises(InputFileError, match="merge keys"):
        parse_pod_manifest(body, "request body")
    with pytest.raises(QuotaBodyError, match="merge keys"):
        read_quota(body.encode())


def test_a_quota_giving_a_limit_twice_is_refused_naming_it() -> None:
    body = QUOTA_YAML + '    limits.nvidia.com/gpumem: "8192"\n'
    with pytest.raises(QuotaBodyError) as refused:
        read_quota(body.encode())
    assert str(refused.value).endswith(
        "spec.hard['limits.nvidia.com/gpumem'] is given twice (lines 8 and 9)")


def test_a_json_quota_giving_a_field_twice_is_refused_as_yaml_is() -> None:
    body = ('{"apiVersion": "v1", "kind": "ResourceQuota",\n'
            '"metadata": {"name": "a", "name": "b", "namespace": "lab"}}')
    with pytest.raises(QuotaBodyError) as refused:
        read_quota(body.encode())
    assert str(refused.value) == ("request body: metadata.name is given twice (line 2, "
                                  "columns 14 and 27)")


def test_the_quota_is_read_when_its_keys_are_distinct() -> None:
    assert read_quota(QUOTA_YAML.encode()).manifest.metadata.name == "gpu-quota"


# --------------------------------------------------------------------------------- fuzz
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
keys = st.sampled_from(["name", "namespace", "annotations", "a", "<<", "'<<'", "k"])
scalars = st.sampled_from(["1", "x", "*a", "&a v", "&a {k: v}", "[*a, *a]", "{}", "null"])


@st.composite
def mappings(draw: st.DrawFn, depth: int = 2) -> str:
    """A flow mapping with keys that repeat, merge keys, anchors and aliases."""
    items = []
    for _ in range(draw(st.integers(0, 4))):
        value = draw(mappings(depth - 1)) if depth and draw(st.booleans()) else draw(scalars)
        items.append(f"{draw(keys)}: {value}")
    return "{" + ", ".join(items) + "}"


@FUZZ
@given(metadata=mappings(), spec=mappings())
def test_fuzzed_pods_with_repeated_keys_merges_and_aliases_are_read_or_refused_in_one_line(
        metadata: str, spec: str) -> None:
    body = f"kind: Pod\nmetadata: {metadata}\nspec: {spec}\n"
    for text in (body, body.encode()):
        try:
            parse_pod_manifest(text, "request body")
        except InputFileError as error:
            message = str(error)
            assert message.startswith("request body: ")
            assert "\n" not in message


@FUZZ
@given(hard=mappings(depth=1))
def test_fuzzed_quotas_with_repeated_keys_merges_and_aliases_are_read_or_refused(
        hard: str) -> None:
    body = QUOTA_YAML.replace('  hard:\n    limits.nvidia.com/gpumem: "4096"\n',
                              f"  hard: {hard}\n")
    try:
        read_quota(body.encode())
    except QuotaBodyError as error:
        assert "\n" not in str(error)
