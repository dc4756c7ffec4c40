"""``pyhami scheduler --device-config FILE``: the configuration read by the command reaches
every part of the daemon that reads requests: the webhook over its HTTPS listener, the
filter (through the standalone pod API's pending loop), the quota API and the metrics."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.core.annotations import decode_devices
from pyhami.cli import build_parser
from pyhami.natsserver import LocalNatsServer, free_port
from pyhami.sandbox import RunningDaemon, SimulatedAgent
from scheduler.cli import config_from
from tests.certs import server_files
from tests.harness import PodClient
from tests.scheduler.web.test_webhook_http import Webhook, patch_of, review

DEVICE_CONFIG = """\
nvidia:
  resourceCountName: example.com/vgpu
  resourceMemoryName: example.com/vmem
  resourceMemoryPercentageName: example.com/vmem-share
  resourceCoreName: example.com/vcores
  resourcePriorityName: example.com/vprio
  memoryFactor: 2
"""
NODE = "gpu-node-1"
ALLOCATED = "hami.io/vgpu-devices-allocated"


def custom_pod(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "cuda:12",
                                     "resources": {"limits": limits}}]}}


@dataclass
class Configured:
    """A standalone daemon started from ``pyhami scheduler``'s flags with the file."""

    daemon: RunningDaemon
    webhook: Webhook
    pods: PodClient
    metrics_url: str


@pytest.fixture
async def configured(jetstream_server: LocalNatsServer, tmp_path: Path,
                     http: aiohttp.ClientSession) -> AsyncIterator[Configured]:
    device_file = tmp_path / "device-config.yaml"
    device_file.write_text(DEVICE_CONFIG)
    (tmp_path / "tls").mkdir()
    tls = server_files(tmp_path / "tls")
    hook, listen, metrics = free_port(), free_port(), free_port()
    args = build_parser().parse_args([
        "scheduler", "--standalone", "--nats", jetstream_server.url,
        "--device-config", str(device_file), "--listen", f"127.0.0.1:{listen}",
        "--metrics", f"127.0.0.1:{metrics}", "--webhook-listen", f"127.0.0.1:{hook}",
        "--tls-cert-file", str(tls.cert), "--tls-private-key-file", str(tls.key)])
    config = replace(config_from(args), resync_wait=0.3, retry_period=0.5)
    node = SimulatedAgent.start(NODE, jetstream_server.url)
    daemon = await RunningDaemon(config).start()
    context = ssl.create_default_context(cafile=str(tls.ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield Configured(daemon, Webhook(f"https://127.0.0.1:{hook}/webhook", session),
                         PodClient(http, daemon.url), f"http://127.0.0.1:{metrics}/metrics")
    await daemon.stop()
    await node.halt()


@pytest.mark.parametrize(("limits", "env"), [
    pytest.param({"example.com/vgpu": "1", "example.com/vprio": "0"},
                 [{"name": "CUDA_TASK_PRIORITY", "value": "0"}], id="configured-priority"),
    pytest.param({"example.com/vgpu": "1", "nvidia.com/priority": "0"}, None,
                 id="hamis-default-priority-not-read"),
])
async def test_the_webhook_reads_the_configured_names(
        configured: Configured, limits: dict[str, str],
        env: list[dict[str, str]] | None) -> None:
    status, answer = await configured.webhook.post(review(custom_pod("trainer", limits)))
    assert status == 200 and answer["response"]["allowed"]
    patch = patch_of(answer)
    # A GPU pod under the configured count name: sent to pyhami.
    assert {"op": "add", "path": "/spec/schedulerName",
            "value": configured.daemon.config.scheduler_name} in patch
    envs = [op["value"] for op in patch if op["path"].startswith("/spec/containers/0/env")]
    assert envs == ([] if env is None else [env])


async def test_a_pod_asking_the_configured_names_is_filtered_as_a_gpu_pod(
        configured: Configured) -> None:
    """Placed by the filter on a card, with memoryFactor applied to its memory."""
    allocated = await configured.pods.submit_and_place(custom_pod("trainer", {
        "example.com/vgpu": 1, "example.com/vmem": 1000, "example.com/vcores": 30}))
    [[grant]] = decode_devices(allocated)
    assert (grant.memory, grant.cores) == (2000, 30)


async def test_quotas_are_checked_and_shown_under_the_configured_names(
        configured: Configured, http: aiohttp.ClientSession) -> None:
    url = f"{configured.pods.url}/api/resourcequotas"
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "gpu-quota", "namespace": "default"},
             "spec": {"hard": {"limits.example.com/vmem": "1.5"}}}
    async with http.post(url, data=json.dumps(quota)) as response:
        assert response.status == 400
        assert (await response.text()).strip() == (
            "ResourceQuota default/gpu-quota: spec.hard[limits.example.com/vmem]: '1.5' is not "
            "an integer")
    quota["spec"] = {"hard": {"limits.example.com/vmem": "4000"}}
    async with http.post(url, data=json.dumps(quota)) as response:
        assert response.status == 201, await response.text()
    await configured.pods.submit_and_place(custom_pod("trainer", {
        "example.com/vgpu": 1, "example.com/vmem": 1000}))
    async with http.get(configured.metrics_url) as response:
        text = await response.text()
    used = {(s.labels["namespace"], s.labels["quota_name"], s.labels["limit"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "hami_resource_quota_used" for s in family.samples}
    # The limit and the use both times memoryFactor 2, as HAMi counts them.
    assert used[("default", "example.com/vmem", "8000")] == 2000
