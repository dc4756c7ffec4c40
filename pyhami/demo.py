"""``pyhami demo``: the article's lab, live, on this machine or on a running stack.

It starts a nats-server, simulated nodes (four Tesla T4 by default) and the
daemon in standalone mode (or, with ``--daemon``, drives a standalone daemon
already running, as the compose stack's), then plays kube-scheduler's part over
the extender API: for every pod /filter, then /bind; a pod that fits nowhere
waits and is tried again whenever a pod is deleted. Each pod's selection path is
drawn as a table: every card with its tenants and score, the filter that removed
it, its rank, the chosen card marked.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rich.console import Console
from rich.table import Table

from agent.vendors.nvidia.simulated import PROFILES
from common.arguments import (
    Subcommands,
    add_policy_defaults,
    defaults_from,
    positive_int,
    positive_seconds,
)
from common.core.errors import PyhamiError
from common.core.pod import DEFAULT_NAMESPACE
from common.stopping import stop_on_signals
from pyhami.natsserver import NatsServerError
from pyhami.output import fitted, selection_path, stdout_console
from pyhami.sandbox import Sandbox

GPU_POLICY = "hami.io/gpu-scheduler-policy"
# The demo's pods name a scheduler of their own: a daemon's standalone loop leaves them
# to the demo's /filter and /bind, as kube-scheduler leaves other schedulers' pods.
DEMO_SCHEDULER = "pyhami-demo"
# On a running daemon every pod of the demo lives here, and what an earlier run left
# here is deleted first.
DEMO_NAMESPACE = "pyhami-demo"
READY_TIMEOUT_S = 120.0


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("demo", help="replay the article's lab against a live daemon")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="t4x4",
                        help="simulated node profile (default t4x4: the article's four T4)")
    parser.add_argument("--nodes", type=positive_int, default=1, help="simulated nodes (default 1)")
    parser.add_argument("--scenario", type=Path,
                        help="play these steps instead of the article's lab (YAML, see docs)")
    parser.add_argument("--port", type=int, help="the daemon's port (default: a free one)")
    parser.add_argument("--nats-port", type=int, help="nats-server's port (default: a free one)")
    parser.add_argument("--daemon", metavar="URL",
                        help="drive this running standalone daemon (e.g. the compose stack's "
                             "http://scheduler:8888) instead of starting one; its pods go to "
                             f"the namespace {DEMO_NAMESPACE}")
    parser.add_argument("--lab-node", metavar="NAME",
                        help="with --daemon: the node the lab runs on, a simulated t4x4 node "
                             "(default: the first node the daemon knows)")
    parser.add_argument("--ready-timeout", type=positive_seconds, default=READY_TIMEOUT_S,
                        metavar="SECONDS",
                        help="with --daemon: how long to wait for it to be ready and to know "
                             f"the lab node (default {READY_TIMEOUT_S:g})")
    add_policy_defaults(parser)
    parser.set_defaults(handler=run_command)


# Scenarios -------------------------------------------------------------------


class ScenarioError(PyhamiError):
    """The demo cannot go on: a scenario file that cannot be played, or a step the daemon
    refused; the message says where."""


@dataclass(frozen=True)
class Step:
    """``title`` opens a section; ``submit`` places a pod; ``delete`` removes one by name;
    ``quota`` stores a ResourceQuota (or replaces the one of its name)."""

    title: str | None = None
    submit: dict[str, Any] | None = None
    delete: str | None = None
    quota: dict[str, Any] | None = None


def lab_pod(name: str, annotations: dict[str, str] | None = None,
            limits: dict[str, int] | None = None) -> dict[str, Any]:
    """A lab pod: one container asking one card with a 1000 MiB slice, unless ``limits``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": DEFAULT_NAMESPACE,
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "app", "image": "ubuntu:22.04", "resources": {
                "limits": limits or {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}]}}


def lab_scenario(first_node: str) -> list[Step]:
    """The four steps of the article's lab (docs/demo.md)."""
    binpack = {GPU_POLICY: "binpack"}
    steps = [Step(title="1. default spread: four pods without a policy")]
    steps += [Step(submit=lab_pod(f"spread-{i}")) for i in range(4)]
    steps += [Step(delete=f"spread-{i}") for i in range(4)]
    steps.append(Step(title="2. binpack stacking: three pods annotated binpack"))
    steps += [Step(submit=lab_pod(f"binpack-{i}", binpack)) for i in range(3)]
    steps += [Step(delete=f"binpack-{i}") for i in range(3)]
    steps.append(Step(title="3. mutex blocking and release"))
    steps += [Step(submit=lab_pod(f"tenant-{i}")) for i in range(4)]
    steps.append(Step(submit=lab_pod("mutex", {GPU_POLICY: "mutex"})))
    steps.append(Step(delete="tenant-1"))
    steps += [Step(delete=name) for name in ("tenant-0", "tenant-2", "tenant-3", "mutex")]
    steps.append(Step(title="4. composed mutex,binpack"))
    steps.append(Step(submit=lab_pod("binpack-a", binpack)))
    steps.append(Step(submit=lab_pod("binpack-b", binpack)))
    steps.append(Step(submit=lab_pod("pinned", {
        "nvidia.com/use-gpuuuid": f"GPU-{first_node}-1"})))
    steps.append(Step(submit=lab_pod("mutex-binpack", {GPU_POLICY: "mutex,binpack"})))
    steps.append(Step(title="the same pod with plain binpack, after mutex-binpack is deleted"))
    steps.append(Step(delete="mutex-binpack"))
    steps.append(Step(submit=lab_pod("plain-binpack", binpack)))
    return steps


def load_scenario(path: Path) -> list[Step]:
    """A YAML list: ``- title: TEXT``, ``- submit: MANIFEST or FILE``, ``- delete: NAME``,
    ``- quota: MANIFEST or FILE`` (a ResourceQuota)."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ScenarioError(f"{path}: {error}".replace("\n", " ")) from None
    if not isinstance(document, list):
        raise ScenarioError(f"{path}: expected a list of steps")
    steps = []
    for position, entry in enumerate(document):
        where = f"{path}: step {position + 1}"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ScenarioError(f"{where}: expected one of title, submit, delete, quota")
        (kind, value), = entry.items()
        if kind == "title" and isinstance(value, str):
            steps.append(Step(title=value))
        elif kind == "delete" and isinstance(value, str):
            steps.append(Step(delete=value))
        elif kind in ("submit", "quota"):
            if isinstance(value, str):
                try:
                    value = yaml.safe_load((path.parent / value).read_text())
                except (OSError, yaml.YAMLError) as error:
                    raise ScenarioError(f"{where}: {value}: {error}".replace("\n", " ")) from None
            manifest = _manifest(value, where, "Pod" if kind == "submit" else "ResourceQuota")
            steps.append(Step(submit=manifest) if kind == "submit" else Step(quota=manifest))
        else:
            raise ScenarioError(f"{where}: {kind!r} with {type(value).__name__} is not a step")
    return steps


def _manifest(value: object, where: str, kind: str = "Pod") -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("metadata"), dict) or not (
        value["metadata"].get("name")
    ):
        raise ScenarioError(f"{where}: a {kind} manifest with metadata.name is needed")
    value["metadata"].setdefault("namespace", DEFAULT_NAMESPACE)
    return value


# Playing ----------------------------------------------------------------------


@dataclass
class Placement:
    pod: str
    policy: str
    result: str


class Driver:
    """kube-scheduler's part: filter then bind, retrying waiting pods when a pod leaves.

    ``nodes`` fixes the node names every /filter offers (default: all the daemon knows);
    ``namespace`` moves every submitted pod there.
    """

    def __init__(self, http: aiohttp.ClientSession, url: str, console: Console, *,
                 nodes: list[str] | None = None, namespace: str | None = None) -> None:
        self.http = http
        self.url = url
        self.console = console
        self.nodes = nodes
        self.namespace = namespace
        self.namespaces: dict[str, str] = {}
        self.waiting: dict[str, dict[str, Any]] = {}
        self.placements: list[Placement] = []

    async def _post(self, path: str, body: object) -> Any:
        async with self.http.post(f"{self.url}{path}", json=body) as response:
            if response.status >= 400:
                raise ScenarioError(f"{path}: {response.status} {await response.text()}")
            return await response.json()

    async def submit(self, manifest: dict[str, Any]) -> None:
        if self.namespace is not None:
            manifest["metadata"]["namespace"] = self.namespace
        manifest.setdefault("spec", {})["schedulerName"] = DEMO_SCHEDULER
        created = await self._post("/api/pods", manifest)
        manifest["metadata"]["uid"] = created["uid"]
        self.namespaces[manifest["metadata"]["name"]] = manifest["metadata"]["namespace"]
        await self.schedule(manifest)

    async def schedule(self, manifest: dict[str, Any]) -> bool:
        name = manifest["metadata"]["name"]
        policy = manifest["metadata"].get("annotations", {}).get(GPU_POLICY, "default")
        nodes = await self._nodes()
        only = "?" + "&".join(f"node={n}" for n in self.nodes) if self.nodes else ""
        path = await self._post(f"/explain{only}", manifest)
        result = await self._post("/filter", {"Pod": manifest, "NodeNames": nodes})
        if result["NodeNames"]:
            node = result["NodeNames"][0]
            bound = await self._post("/bind", {
                "PodName": name, "PodNamespace": manifest["metadata"]["namespace"],
                "PodUID": manifest["metadata"]["uid"], "Node": node})
            if not bound["Error"]:
                cards = ", ".join(f"GPU {c['index']}" for cs in path["devices"] for c in cs)
                where = f"{cards} on {node}"
                self.console.print(f"  {name:<15} [dim]{policy:<14}[/] -> [green]{where}[/]")
                self.console.print(selection_path(path))
                if self.waiting.pop(name, None) is not None:
                    earlier = next(p for p in self.placements if p.pod == name)
                    earlier.result = f"{earlier.result}, then {where}"
                else:
                    self.placements.append(Placement(name, policy, where))
                return True
            why = bound["Error"]
        else:
            failed = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
            why = "; ".join(f"{n}: {r}" for n, r in sorted(failed.items())) or result["Error"]
        if name not in self.waiting:
            self.waiting[name] = manifest
            self.console.print(f"  {name:<15} [dim]{policy:<14}[/] -> [yellow]Pending[/] ({why})")
            self.console.print(selection_path(path))
            self.placements.append(Placement(name, policy, f"waited ({why})"))
        return False

    async def delete(self, name: str) -> None:
        namespace = self.namespaces.get(name, self.namespace or DEFAULT_NAMESPACE)
        async with self.http.delete(f"{self.url}/api/pods/{namespace}/{name}") as response:
            if response.status != 204:
                raise ScenarioError(f"delete {name}: {response.status} {await response.text()}")
        self.waiting.pop(name, None)
        self.console.print(f"  [dim]deleted {name}[/]")
        await self._retry_waiting()

    async def set_quota(self, manifest: dict[str, Any]) -> None:
        """Store a ResourceQuota (replacing the one of its name); waiting pods are tried
        again, as pyhami asks kube-scheduler to when a quota changes."""
        metadata = manifest["metadata"]
        if self.namespace is not None:
            metadata["namespace"] = self.namespace
        where = f"{self.url}/api/resourcequotas/{metadata['namespace']}/{metadata['name']}"
        async with self.http.put(where, json=manifest) as response:
            if response.status not in (200, 201):
                raise ScenarioError(f"quota {metadata['name']}: {response.status} "
                                    f"{await response.text()}")
        hard = manifest.get("spec", {}).get("hard", {})
        limits = ", ".join(f"{key} {value}" for key, value in hard.items()
                           if key.startswith("limits.nvidia.com/")) or "no GPU limit"
        self.console.print(f"  [dim]ResourceQuota {metadata['name']} in "
                           f"{metadata['namespace']}: {limits}[/]")
        await self._retry_waiting()

    async def _retry_waiting(self) -> None:
        for manifest in list(self.waiting.values()):  # as kube-scheduler requeues
            if await self.schedule(manifest):
                self.console.print(f"  [dim]{manifest['metadata']['name']} was waiting and is "
                                   "now placed, without being submitted again[/]")

    async def _nodes(self) -> list[str]:
        if self.nodes is not None:
            return self.nodes
        return await known_nodes(self.http, self.url)

    async def clear_namespace(self) -> None:
        """Deletes every pod and ResourceQuota in the driver's namespace: what an earlier
        run left there."""
        async with self.http.get(f"{self.url}/api/pods") as response:
            pods = await response.json()
        async with self.http.get(f"{self.url}/api/resourcequotas") as response:
            quotas = (await response.json())["items"] if response.status == 200 else []
        doomed = [("pods", pod["name"]) for pod in pods if pod["namespace"] == self.namespace]
        doomed += [("resourcequotas", quota["metadata"]["name"]) for quota in quotas
                   if quota["metadata"]["namespace"] == self.namespace]
        for kind, name in doomed:
            where = f"{self.url}/api/{kind}/{self.namespace}/{name}"
            async with self.http.delete(where) as response:
                if response.status not in (204, 404):
                    raise ScenarioError(f"delete {name}: {response.status} "
                                        f"{await response.text()}")


async def known_nodes(http: aiohttp.ClientSession, url: str) -> list[str]:
    async with http.get(f"{url}/statusz") as response:
        status = await response.json()
    nodes: list[str] = status["node_names"]
    return nodes


async def wait_for_daemon(http: aiohttp.ClientSession, url: str, node: str | None,
                          timeout: float = READY_TIMEOUT_S) -> str:
    """Waits until the daemon is ready and knows ``node`` (or any node); returns the node.

    A stack that has just started answers late, so a refused connection is tried again.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "no answer"
    while loop.time() < deadline:
        try:
            async with http.get(f"{url}/readyz") as response:
                ready, last = response.status == 200, f"/readyz answered {response.status}"
            if ready:
                nodes = await known_nodes(http, url)
                if nodes and (node is None or node in nodes):
                    return node or nodes[0]
                last = f"it knows the nodes {nodes}, not {node or 'any'}"
        except aiohttp.ClientError as error:
            last = str(error) or type(error).__name__
        await asyncio.sleep(0.5)
    raise ScenarioError(f"{url}: not ready for the demo after {timeout:g} s ({last})")


def summary(placements: list[Placement]) -> Table:
    table = Table(title="summary", title_justify="left")
    for column in ("pod", "policy", "result"):
        table.add_column(column)
    for placement in placements:
        table.add_row(placement.pod, placement.policy, placement.result)
    return table


async def play(scenario: list[Step] | None, args: argparse.Namespace,
               console: Console) -> int:
    """Plays ``scenario`` (default: the lab) on a sandbox, or on ``args.daemon``."""
    if args.daemon is not None:
        return await play_on_daemon(scenario, args.daemon.rstrip("/"), args.lab_node,
                                    args.ready_timeout, console)
    nodes = [(f"gpu-node-{i + 1}", args.profile) for i in range(args.nodes)]
    with console.status(f"starting nats-server, {len(nodes)} simulated node(s) "
                        f"({args.profile}) and the pyhami daemon..."):
        sandbox = Sandbox(nodes, port=args.port, nats_port=args.nats_port,
                          defaults=defaults_from(args))
        await sandbox.__aenter__()
    try:
        console.print(f"[dim]daemon at {sandbox.url}; nats at "
                      f"{sandbox.nats.url if sandbox.nats else '?'}[/]")
        async with aiohttp.ClientSession() as http:
            driver = Driver(http, sandbox.url, console)
            steps = scenario if scenario is not None else lab_scenario(nodes[0][0])
            await play_steps(driver, steps)
    finally:
        await sandbox.__aexit__(None, None, None)
    return 0


async def play_on_daemon(scenario: list[Step] | None, url: str, lab_node: str | None,
                         ready_timeout: float, console: Console) -> int:
    """The steps on a standalone daemon already running, in the namespace of the demo,
    which is emptied before and after."""
    async with aiohttp.ClientSession() as http:
        with console.status(f"waiting for the daemon at {url}..."):
            node = await wait_for_daemon(http, url, lab_node, ready_timeout)
        console.print(f"[dim]daemon at {url}; the lab runs on {node}; its pods live in the "
                      f"namespace {DEMO_NAMESPACE}[/]")
        driver = Driver(http, url, console, nodes=[node], namespace=DEMO_NAMESPACE)
        await driver.clear_namespace()
        try:
            await play_steps(driver, scenario if scenario is not None else lab_scenario(node))
        finally:
            try:
                await driver.clear_namespace()
            except (aiohttp.ClientError, ScenarioError) as error:
                console.print(f"[yellow]pods of the demo left in {DEMO_NAMESPACE} ({error}); "
                              "the next run deletes them[/]")
    return 0


async def play_steps(driver: Driver, steps: list[Step]) -> None:
    for step in steps:
        if step.title is not None:
            driver.console.rule(step.title)
        elif step.submit is not None:
            await driver.submit(step.submit)
        elif step.delete is not None:
            await driver.delete(step.delete)
        elif step.quota is not None:
            await driver.set_quota(step.quota)
    driver.console.print(fitted(summary(driver.placements)))


def run_command(args: argparse.Namespace) -> int:
    return run(args)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or stdout_console()
    try:
        scenario = load_scenario(args.scenario) if args.scenario is not None else None
    except ScenarioError as error:
        print(f"pyhami demo: {error}", file=sys.stderr)
        return 2

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        stop_on_signals(task.cancel)
        return await play(scenario, args, out)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        print("pyhami demo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    except NatsServerError as error:
        print(f"pyhami demo: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of stdout went away: pyhami.cli ends quietly
        raise
    except aiohttp.ClientError as error:  # before OSError: a refused connection is both
        print(f"pyhami demo: {args.daemon}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"pyhami demo: {error} (is the port taken? choose another with --port or "
              "--nats-port)", file=sys.stderr)
        return 1
    except ScenarioError as error:
        print(f"pyhami demo: {error}", file=sys.stderr)
        return 1


