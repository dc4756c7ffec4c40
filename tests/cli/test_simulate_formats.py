"""``pyhami simulate``'s input files: pyhami's own cluster and workload (JSON, YAML) and the
openb trace's node and pod lists, each recognised from its content."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from common.core.deviceconfig import DeviceConfig
from common.core.model import Card, Node
from common.core.quota import Quota, Scope, ScopeRule
from common.core.vendors import ResourceNames
from common.files import InputFileError
from pyhami.simulate._formats import load_trace
from pyhami.simulate._trace import SimPod

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
              "creation_time,deletion_time,scheduled_time")
ONE_NODE = f"{NODE_HEADER}\nnode-a,96000,393216,1,T4\n"
ONE_POD = f"{POD_HEADER}\npod-a,4000,8192,1,1000,,LS,Running,100,200,100\n"

OWN_CLUSTER = {"nodes": [{"name": "gpu-1", "devices": [
    {"uuid": "GPU-0", "index": 0, "type": "A100", "memory": 40960},
    {"uuid": "GPU-1", "index": 1, "type": "A100", "memory": 40960},
]}]}


def write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


def openb(tmp_path: Path, nodes: str = ONE_NODE, pods: str = ONE_POD) -> tuple[Path, Path]:
    return write(tmp_path / "nodes.csv", nodes), write(tmp_path / "pods.csv", pods)


def openb_pods(tmp_path: Path, *rows: str) -> list[SimPod]:
    nodes, pods = openb(tmp_path, pods="\n".join([POD_HEADER, *rows]) + "\n")
    return load_trace(nodes, pods).pods


def limits(pod: SimPod) -> Mapping[str, object]:
    resources = pod.manifest.spec.containers[0].resources
    assert resources is not None and resources.limits is not None
    return resources.limits


def pod(name: str, gpus: int = 1, **extra: object) -> dict[str, object]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": gpus}}}]}, **extra}


def own_workload(tmp_path: Path, entries: object) -> Path:
    return write(tmp_path / "workload.json", json.dumps(entries))


def load_own(tmp_path: Path, entries: object) -> list[SimPod]:
    cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
    return load_trace(cluster, own_workload(tmp_path, entries)).pods


class TestOpenbNodes:
    def test_cards_named_after_the_serial_with_the_models_memory(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path, nodes=f"{NODE_HEADER}\nn-1,64000,262144,2,V100M32\n"
                                            "n-2,96000,393216,1,A10\n")
        assert load_trace(nodes, pods).nodes == [
            Node(name="n-1", cards=[
                Card(uuid="n-1-0", index=0, type="V100M32", memory=32768, cores=100, count=10,
                     numa=-1),
                Card(uuid="n-1-1", index=1, type="V100M32", memory=32768, cores=100, count=10,
                     numa=-1)]),
            Node(name="n-2", cards=[
                Card(uuid="n-2-0", index=0, type="A10", memory=24576)]),
        ]

    @pytest.mark.parametrize(("model", "memory"), [
        ("P100", 16384), ("T4", 16384), ("V100M16", 16384), ("G2", 16384), ("G3", 16384)])
    def test_memory_of_each_model(self, tmp_path: Path, model: str, memory: int) -> None:
        nodes, pods = openb(tmp_path, nodes=f"{NODE_HEADER}\nn-1,8000,1024,1,{model}\n")
        assert load_trace(nodes, pods).nodes[0].cards[0].memory == memory

    def test_nodes_without_gpus_are_left_out(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path, nodes=f"{NODE_HEADER}\ncpu-1,32000,262144,0,\n"
                                            "cpu-2,32000,262144,0,nan\nn-1,8000,1024,1,T4\n")
        assert [node.name for node in load_trace(nodes, pods).nodes] == ["n-1"]

    def test_columns_found_by_name_in_any_order(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path, nodes="model,gpu,sn,cpu_milli,memory_mib\nT4,2,n-9,1,1\n")
        assert [card.uuid for card in load_trace(nodes, pods).nodes[0].cards] == [
            "n-9-0", "n-9-1"]


class TestOpenbPods:
    def test_a_share_of_one_card_is_its_cores_and_memory_percentage(
            self, tmp_path: Path) -> None:
        [shared] = openb_pods(tmp_path, "p,4000,8192,1,250,,BE,Running,0,10,0")
        assert limits(shared) == {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 25,
                                  "nvidia.com/gpumem-percentage": 25}

    @pytest.mark.parametrize(("milli", "percent"), [(215, 22), (5, 1), (1, 1), (999, 100)])
    def test_a_share_is_rounded_up_to_a_whole_percent(
            self, tmp_path: Path, milli: int, percent: int) -> None:
        [shared] = openb_pods(tmp_path, f"p,1,1,1,{milli},,BE,Running,0,10,0")
        assert limits(shared)["nvidia.com/gpucores"] == percent
        assert limits(shared)["nvidia.com/gpumem-percentage"] == percent

    @pytest.mark.parametrize("milli", [1000, 0])
    def test_whole_cards(self, tmp_path: Path, milli: int) -> None:
        [whole] = openb_pods(tmp_path, f"p,88000,327680,8,{milli},,Burstable,Succeeded,0,10,0")
        assert limits(whole) == {"nvidia.com/gpu": 8, "nvidia.com/gpucores": 100,
                                 "nvidia.com/gpumem-percentage": 100}

    def test_gpu_spec_becomes_the_gpu_type_annotation(self, tmp_path: Path) -> None:
        typed, free, nan = openb_pods(tmp_path, "a,1,1,1,1000,V100M16|V100M32,LS,Running,0,9,0",
                                      "b,1,1,1,1000,,LS,Running,1,9,1",
                                      "c,1,1,1,1000,nan,LS,Running,2,9,2")
        assert typed.manifest.metadata.annotations == {
            "nvidia.com/use-gputype": "V100M16,V100M32"}
        assert free.manifest.metadata.annotations is None
        assert nan.manifest.metadata.annotations is None

    def test_a_type_listed_twice_is_named_once(self, tmp_path: Path) -> None:
        [typed] = openb_pods(tmp_path, "a,1,1,1,1000,V100M16|V100M32|V100M32,LS,Running,0,9,0")
        assert typed.manifest.metadata.annotations == {
            "nvidia.com/use-gputype": "V100M16,V100M32"}

    def test_name_and_namespace(self, tmp_path: Path) -> None:
        [only] = openb_pods(tmp_path, "openb-pod-0017,1,1,1,1000,,LS,Running,0,9,0")
        assert only.manifest.key == "default/openb-pod-0017"

    def test_arrival_counts_from_the_first_gpu_pods_creation(self, tmp_path: Path) -> None:
        pods = openb_pods(tmp_path, "cpu,1,1,0,0,,LS,Running,9437000,9437900,9437000",
                          "a,1,1,1,1000,,LS,Running,9437497,10769854,9437497",
                          "b,1,1,1,460,,LS,Running,9476974,12902960,9476974")
        assert [(p.manifest.metadata.name, p.arrival) for p in pods] == [
            ("a", 0.0), ("b", 9476974.0 - 9437497.0)]

    def test_pods_are_sorted_by_arrival_keeping_the_files_order_on_ties(
            self, tmp_path: Path) -> None:
        pods = openb_pods(tmp_path, "late,1,1,1,1000,,LS,Running,50,90,50",
                          "tie-1,1,1,1,1000,,LS,Running,20,90,20",
                          "tie-2,1,1,1,1000,,LS,Running,20,90,20")
        assert [(p.manifest.metadata.name, p.arrival) for p in pods] == [
            ("tie-1", 0.0), ("tie-2", 0.0), ("late", 30.0)]

    def test_duration_runs_from_scheduling_to_deletion(self, tmp_path: Path) -> None:
        [started_late] = openb_pods(tmp_path, "a,1,1,1,1000,,LS,Running,10001854,10043044,"
                                              "10002793")
        assert started_late.duration == 10043044 - 10002793

    def test_a_pod_never_scheduled_runs_from_creation(self, tmp_path: Path) -> None:
        [pending] = openb_pods(tmp_path, "a,1,1,1,1000,,BE,Pending,10001278,10001403,")
        assert pending.duration == 125.0

    def test_a_scheduling_time_before_creation_counts_from_creation(
            self, tmp_path: Path) -> None:
        [early] = openb_pods(tmp_path, "a,1,1,1,1000,,LS,Running,100,160,0")
        assert early.duration == 60.0

    def test_a_pod_deleted_in_its_first_second_runs_one_second(self, tmp_path: Path) -> None:
        [instant] = openb_pods(tmp_path, "a,1,1,1,230,,BE,Pending,12774042,12774042,")
        assert instant.duration == 1.0

    def test_without_a_deletion_time_it_runs_to_the_end(self, tmp_path: Path) -> None:
        [forever] = openb_pods(tmp_path, "a,1,1,1,1000,,LS,Running,5,,5")
        assert forever.duration is None

    def test_cpu_only_pods_are_left_out_and_counted(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path, pods="\n".join([
            POD_HEADER, "cpu-1,20000,65536,0,0,,LS,Running,0,9,0",
            "gpu-1,1,1,1,1000,,LS,Running,1,9,1", "cpu-2,8000,30517,0,0,,BE,Running,2,9,2"]))
        trace = load_trace(nodes, pods)
        assert [p.manifest.metadata.name for p in trace.pods] == ["gpu-1"]
        assert trace.cpu_only == 2

    def test_failed_and_pending_pods_still_arrive(self, tmp_path: Path) -> None:
        pods = openb_pods(tmp_path, "failed,3152,5600,1,1000,,BE,Failed,0,200,0",
                          "pending,1,1,1,1000,,BE,Pending,5,60,")
        assert [p.manifest.metadata.name for p in pods] == ["failed", "pending"]

    def test_counts_written_as_decimals_are_read(self, tmp_path: Path) -> None:
        [pod_] = openb_pods(tmp_path, "a,1,1,2.0,1000.0,,LS,Running,0.0,10.0,0.0")
        assert limits(pod_)["nvidia.com/gpu"] == 2
        assert pod_.duration == 10.0


class TestRecognition:
    def test_a_txt_file_with_openb_headers_is_read_as_openb(self, tmp_path: Path) -> None:
        nodes = write(tmp_path / "nodes.txt", ONE_NODE)
        pods = write(tmp_path / "pods.txt", ONE_POD)
        trace = load_trace(nodes, pods)
        assert [n.name for n in trace.nodes] == ["node-a"]
        assert [p.manifest.key for p in trace.pods] == ["default/pod-a"]

    def test_a_byte_order_mark_and_crlf_lines_are_accepted(self, tmp_path: Path) -> None:
        nodes = tmp_path / "nodes.csv"
        nodes.write_bytes(b"\xef\xbb\xbf" + ONE_NODE.replace("\n", "\r\n").encode())
        pods = write(tmp_path / "pods.csv", ONE_POD)
        assert [n.name for n in load_trace(nodes, pods).nodes] == ["node-a"]

    def test_an_openb_cluster_with_a_yaml_workload(self, tmp_path: Path) -> None:
        nodes = write(tmp_path / "nodes.csv", ONE_NODE)
        workload = write(tmp_path / "w.yaml", "pods:\n- arrival: 3\n  pod:\n"
                                              "    metadata: {name: a}\n    spec:\n"
                                              "      containers:\n"
                                              "      - resources: {limits: "
                                              "{nvidia.com/gpu: 1}}\n")
        trace = load_trace(nodes, workload)
        assert [n.name for n in trace.nodes] == ["node-a"]
        assert [(p.manifest.key, p.arrival) for p in trace.pods] == [("default/a", 3.0)]

    def test_files_given_the_wrong_way_round(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path)
        with pytest.raises(InputFileError, match=r"pods\.csv: an openb pod list where a "
                                                 r"cluster was expected"):
            load_trace(pods, nodes)
        with pytest.raises(InputFileError, match=r"nodes\.csv: an openb node list where a "
                                                 r"workload was expected"):
            load_trace(nodes, nodes)


class TestOpenbErrors:
    @pytest.mark.parametrize(("nodes", "pods", "problem"), [
        (ONE_NODE, ONE_POD.replace(",gpu_spec", ""), r"pods\.csv: line 1: no column gpu_spec"),
        (f"\n\n{NODE_HEADER}\nn-1,1,1,x,T4\n", ONE_POD,
         r"line 4, column gpu: 'x' is not a number"),
        (ONE_NODE, ONE_POD + "pod-b,1,1,one,1000,,LS,Running,0,9,0\n",
         r"pods\.csv: line 3, column num_gpu: 'one' is not a number"),
        (f"{NODE_HEADER}\nn-1,1,1,-2,T4\n", ONE_POD,
         r"nodes\.csv: line 2, column gpu: '-2' is not a whole number, 0 or more"),
        (f"{NODE_HEADER}\nn-1,1,1,2\n", ONE_POD,
         r"nodes\.csv: line 2: 4 fields, the header names 5"),
        (f"{NODE_HEADER}\nn-1,1,1,2,H100\n", ONE_POD,
         r"line 2, column model: 'H100' is not a GPU model whose memory is known \(P100, T4"),
        (f"{NODE_HEADER}\nnode a:1,1,1,2,T4\n", ONE_POD, r"line 2, column sn: 'node a:1'"),
        (f"{ONE_NODE}node-a,1,1,2,T4\n", ONE_POD,
         r"line 3, column sn: 'node-a' is listed twice \(first on line 2\)"),
    ], ids=["a-missing-column-is-named", "line-numbers-count-blank-lines-before-the-header",
            "a-non-number-names-line-and-column", "a-negative-count-names-line-and-column",
            "a-short-line", "an-unknown-model-is-named", "a-serial-that-cannot-name-a-card",
            "a-serial-listed-twice"])
    def test_a_bad_file_is_refused_naming_where(self, tmp_path: Path, nodes: str, pods: str,
                                                problem: str) -> None:
        node_file, pod_file = openb(tmp_path, nodes=nodes, pods=pods)
        with pytest.raises(InputFileError, match=problem):
            load_trace(node_file, pod_file)

    @pytest.mark.parametrize(("row", "column", "problem"), [
        ("p,1,1,1,1001,,LS,Running,0,9,0", "gpu_milli", "1001 is above 1000"),
        ("p,1,1,1,2.5,,LS,Running,0,9,0", "gpu_milli", "'2.5' is not a whole number"),
        ("p,1,1,1,1000,,LS,Running,,9,0", "creation_time", "empty, expected seconds"),
        ("p,1,1,1,1000,,LS,Running,-5,9,0", "creation_time", "'-5' is negative"),
        ("p,1,1,1,1000,,LS,Running,0,inf,0", "deletion_time", "'inf' is not a finite number"),
        ("p,1,1,1,1000,,LS,Running,10,15,20", "deletion_time",
         "15 is before scheduled_time 20"),
        ("p,1,1,1,1000,,LS,Running,10,5,", "deletion_time", "5 is before creation_time 10"),
        ("pod-a,1,1,1,1000,,LS,Running,0,9,0", "name",
         "'pod-a' is listed twice \\(first on line 2\\)"),
    ])
    def test_bad_pod_fields(self, tmp_path: Path, row: str, column: str, problem: str) -> None:
        nodes, pods = openb(tmp_path, pods=f"{ONE_POD}{row}\n")
        with pytest.raises(InputFileError, match=f"line 3, column {column}: {problem}"):
            load_trace(nodes, pods)


class TestOwnFormat:
    def test_json_cluster_is_the_one_pyhami_decide_reads(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
        trace = load_trace(cluster, own_workload(tmp_path, {"pods": []}))
        assert trace.nodes == [Node(name="gpu-1", cards=[
            Card(uuid="GPU-0", index=0, type="A100", memory=40960),
            Card(uuid="GPU-1", index=1, type="A100", memory=40960)])]
        assert trace.pods == []

    def test_quotas_of_the_cluster_file(self, tmp_path: Path) -> None:
        # kubectl's List, in YAML; a quota of Kubernetes' own resources only does nothing
        # to GPU pods and is left out.
        cluster = write(tmp_path / "cluster.yaml", """\
nodes: []
quotas:
  apiVersion: v1
  kind: List
  items:
  - apiVersion: v1
    kind: ResourceQuota
    metadata: {name: gpu-quota, namespace: team-a, resourceVersion: "7"}
    spec:
      hard: {limits.nvidia.com/gpumem: 16Ki, limits.nvidia.com/gpucores: "200"}
      scopeSelector:
        matchExpressions:
        - {scopeName: PriorityClass, operator: In, values: [high]}
    status: {used: {limits.nvidia.com/gpumem: "0"}}
  - metadata: {name: pods, namespace: team-a}
    spec: {hard: {pods: "10"}}
""")
        trace = load_trace(cluster, own_workload(tmp_path, {"pods": []}))
        assert trace.quotas == (Quota("team-a", "gpu-quota", memory=16384, cores=200,
                                      rules=(ScopeRule(Scope.PRIORITY_CLASS, "In",
                                                       frozenset({"high"})),)),)

    def test_a_quota_pyhami_cannot_apply_is_refused_naming_it(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps({**OWN_CLUSTER, "quotas": [
            {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
             "spec": {"hard": {"limits.nvidia.com/gpumem": "-1"}}}]}))
        with pytest.raises(InputFileError) as refused:
            load_trace(cluster, own_workload(tmp_path, {"pods": []}))
        assert str(refused.value) == (
            f"{cluster}: quotas[0]: ResourceQuota team-a/gpu-quota: "
            "spec.hard[limits.nvidia.com/gpumem]: '-1' is a negative number")

    def test_yaml_cluster_and_workload(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.yaml", """\
nodes:
- name: gpu-1
  devices:
  - {uuid: GPU-0, index: 0, type: T4, memory: 15360, numa: 1}
""")
        workload = write(tmp_path / "workload.yaml", """\
pods:
- arrival: 30
  duration: 600
  pod:
    apiVersion: v1
    kind: Pod
    metadata:
      name: train
      namespace: ml
      annotations: {hami.io/gpu-scheduler-policy: spread}
    spec:
      containers:
      - name: main
        resources:
          limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000}
- arrival: 0.5
  pod:
    metadata: {name: notebook}
    spec:
      containers:
      - resources: {limits: {nvidia.com/gpucores: 30}}
""")
        trace = load_trace(cluster, workload)
        assert trace.nodes == [Node(name="gpu-1", cards=[
            Card(uuid="GPU-0", index=0, type="T4", memory=15360, numa=1)])]
        notebook, train = trace.pods
        assert (notebook.manifest.key, notebook.arrival, notebook.duration) == (
            "default/notebook", 0.5, None)
        assert (train.manifest.key, train.arrival, train.duration) == ("ml/train", 30.0, 600.0)
        assert train.manifest.metadata.annotations == {"hami.io/gpu-scheduler-policy": "spread"}
        assert limits(train) == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}

    def test_a_bare_list_of_entries_is_accepted(self, tmp_path: Path) -> None:
        pods = load_own(tmp_path, [{"arrival": 2, "pod": pod("b")},
                                   {"arrival": 1, "duration": 5, "pod": pod("a")}])
        assert [(p.manifest.key, p.arrival, p.duration) for p in pods] == [
            ("default/a", 1.0, 5.0), ("default/b", 2.0, None)]

    def test_pods_asking_no_gpu_are_left_out_and_counted(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
        web = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "nginx"}]}}
        trace = load_trace(cluster, own_workload(tmp_path, [
            {"arrival": 0, "pod": web}, {"arrival": 0, "pod": pod("gpu")}]))
        assert [p.manifest.key for p in trace.pods] == ["default/gpu"]
        assert trace.cpu_only == 1

    @pytest.mark.parametrize(("entries", "problem"), [
        ([{"arrival": -1, "pod": pod("a")}], r"\$\[0\]\.arrival: -1\.0 is not a finite"),
        ([{"arrival": 1, "duration": 0, "pod": pod("a")}],
         r"\$\[0\]\.duration: 0\.0 is not a finite number of seconds above 0"),
        ({"pods": [{"arrival": 1, "pod": pod("a")}, {"arrival": "soon", "pod": pod("b")}]},
         r"Expected `float`, got `str` - at `\$\.pods\[1\]\.arrival`"),
        ([{"pod": pod("a")}], r"missing required field `arrival`"),
        ([{"arrival": 1, "pod": pod("a"), "departure": 3}], r"unknown field `departure`"),
        ([{"arrival": 1, "pod": pod("a")}, {"arrival": 2, "pod": pod("a")}],
         r"\$\[1\]\.pod: default/a is listed twice \(first at \$\[0\]\)"),
        ([{"arrival": 1, "pod": pod("a", kind="Deployment")}],
         r"\$\[0\]\.pod: kind is 'Deployment', expected 'Pod'"),
        ([{"arrival": 1, "pod": {"spec": {}}}], r"\$\[0\]\.pod\.metadata\.name: a pod needs"),
        ([{"arrival": 1, "pod": pod("a", spec={"containers": 3})}],
         r"\$\[0\]\.pod: Expected `array`, got `int` - at `\$\.spec\.containers`"),
        ({"nodes": []}, r"unknown field `nodes`"),
    ])
    def test_bad_workload_entries(self, tmp_path: Path, entries: object, problem: str) -> None:
        with pytest.raises(InputFileError, match=problem):
            load_own(tmp_path, entries)

    def test_nan_arrival_is_refused(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
        workload = write(tmp_path / "w.yaml", "- arrival: .nan\n  pod: {metadata: {name: a}}\n")
        with pytest.raises(InputFileError, match=r"w\.yaml: \$\[0\]\.arrival: nan is not"):
            load_trace(cluster, workload)

    def test_yaml_aliases_are_refused(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
        workload = write(tmp_path / "w.yaml", "- &p {arrival: 1, pod: {metadata: {name: a}}}\n"
                                              "- *p\n")
        with pytest.raises(InputFileError, match="YAML aliases"):
            load_trace(cluster, workload)

    def test_a_cluster_holding_running_pods_is_refused(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps({
            **OWN_CLUSTER, "pods": [{"namespace": "a", "name": "b", "node": "gpu-1"}]}))
        with pytest.raises(InputFileError, match=r"cluster\.json: pods: a simulated cluster "
                                                 r"starts empty"):
            load_trace(cluster, own_workload(tmp_path, []))

    def test_a_card_listed_twice_is_refused(self, tmp_path: Path) -> None:
        card = {"uuid": "GPU-0", "index": 0, "type": "T4", "memory": 1}
        cluster = write(tmp_path / "cluster.json", json.dumps(
            {"nodes": [{"name": "n", "devices": [card, card]}]}))
        with pytest.raises(InputFileError, match=r"nodes\[0\] \('n'\): card uuid 'GPU-0' is "
                                                 r"listed twice"):
            load_trace(cluster, own_workload(tmp_path, []))

    def test_an_unreadable_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(InputFileError, match=r"absent\.json: No such file"):
            load_trace(tmp_path / "absent.json", tmp_path / "absent.json")

    def test_text_that_is_neither_format(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.txt", "just: [unclosed\n")
        with pytest.raises(InputFileError, match=r"cluster\.txt: not YAML or JSON"):
            load_trace(cluster, cluster)


CUSTOM = DeviceConfig(resources=ResourceNames(
    count="example.com/vgpu", memory="example.com/vmem",
    memory_percentage="example.com/vmem-share", cores="example.com/vcores",
    priority="example.com/vprio"), memory_factor=4)


class TestDeviceConfig:
    """``--device-config``: the quotas, the pods and openb's pods read and written under
    the configured names and memoryFactor, as the daemon reads them."""

    @pytest.mark.parametrize(("device", "hard", "memory", "cores"), [
        pytest.param(DeviceConfig(), {"limits.nvidia.com/gpumem": 1000,
                                      "limits.nvidia.com/gpucores": 200}, 1000, 200,
                     id="defaults"),
        pytest.param(CUSTOM, {"limits.example.com/vmem": 1000,
                              "limits.example.com/vcores": 200}, 4000, 200,
                     id="configured-names-and-factor"),
        pytest.param(CUSTOM, {"limits.nvidia.com/gpumem": 1000,
                              "limits.nvidia.com/gpucores": 200}, None, None,
                     id="hamis-default-keys-not-read-under-other-names"),
    ])
    def test_quotas_are_read_under_the_configured_names(
            self, tmp_path: Path, device: DeviceConfig, hard: dict[str, int],
            memory: int | None, cores: int | None) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps({**OWN_CLUSTER, "quotas": [
            {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
             "spec": {"hard": hard}}]}))
        trace = load_trace(cluster, own_workload(tmp_path, {"pods": []}), device)
        found = [(q.memory, q.cores, q.memory_resource) for q in trace.quotas]
        expected = [] if memory is None else [(memory, cores, device.resources.memory)]
        assert found == expected

    def test_a_refused_quota_names_the_configured_key(self, tmp_path: Path) -> None:
        cluster = write(tmp_path / "cluster.json", json.dumps({**OWN_CLUSTER, "quotas": [
            {"metadata": {"name": "gpu-quota", "namespace": "team-a"},
             "spec": {"hard": {"limits.example.com/vmem": "-1"}}}]}))
        with pytest.raises(InputFileError) as refused:
            load_trace(cluster, own_workload(tmp_path, {"pods": []}), CUSTOM)
        assert str(refused.value) == (
            f"{cluster}: quotas[0]: ResourceQuota team-a/gpu-quota: "
            "spec.hard[limits.example.com/vmem]: '-1' is a negative number")

    @pytest.mark.parametrize(("device", "kept"), [
        pytest.param(DeviceConfig(), ["default/hami-names"], id="defaults"),
        pytest.param(CUSTOM, ["default/configured-names"], id="configured-names"),
    ])
    def test_a_gpu_pod_is_one_asking_for_the_configured_names(
            self, tmp_path: Path, device: DeviceConfig, kept: list[str]) -> None:
        configured = {"metadata": {"name": "configured-names"}, "spec": {"containers": [
            {"name": "main", "resources": {"limits": {"example.com/vgpu": 1}}}]}}
        cluster = write(tmp_path / "cluster.json", json.dumps(OWN_CLUSTER))
        trace = load_trace(cluster, own_workload(tmp_path, [
            {"arrival": 0, "pod": pod("hami-names")}, {"arrival": 0, "pod": configured}]),
            device)
        assert [p.manifest.key for p in trace.pods] == kept
        assert trace.cpu_only == 1

    def test_openb_pods_ask_under_the_configured_names(self, tmp_path: Path) -> None:
        nodes, pods = openb(tmp_path, pods=f"{POD_HEADER}\np,1,1,1,250,,BE,Running,0,10,0\n")
        [shared] = load_trace(nodes, pods, CUSTOM).pods
        assert limits(shared) == {"example.com/vgpu": 1, "example.com/vcores": 25,
                                  "example.com/vmem-share": 25}
