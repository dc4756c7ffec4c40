"""The conventions every ``pyhami`` command keeps: each option falls back to its PYHAMI_<FLAG>
variable by one rule, ``--output table|json`` where a command prints a result, a table that is
whole in a pipe, ``--log-format json`` on the long-running commands, and a pod asking for no
GPU reading as such."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from common.arguments import CommandParser, use_environment, variable_for
from common.logs import JsonFormatter
from pyhami.cli import build_parser
from pyhami.demo import lab_pod
from pyhami.natsserver import LocalNatsServer, free_port
from tests.harness import Lab
from tests.paths import EXAMPLES

LAB = EXAMPLES / "lab-cluster.json"

# Every PYHAMI_ variable the daemon and the agent read before the rule, and that kept its name.
KEPT_VARIABLES = {
    "scheduler": ["PYHAMI_KUBECONFIG", "PYHAMI_IN_CLUSTER", "PYHAMI_STANDALONE", "PYHAMI_LISTEN",
                  "PYHAMI_METRICS", "PYHAMI_URL_PREFIX", "PYHAMI_GPU_SCHEDULER_POLICY",
                  "PYHAMI_NODE_SCHEDULER_POLICY", "PYHAMI_NODE_TIMEOUT", "PYHAMI_NODE_RETENTION",
                  "PYHAMI_NATS_GRACE", "PYHAMI_RESERVATION_TTL", "PYHAMI_RESYNC_WAIT",
                  "PYHAMI_RETRY_PERIOD", "PYHAMI_LOG_LEVEL"],
    "agent": ["PYHAMI_NATS_USER", "PYHAMI_NATS_PASSWORD", "PYHAMI_NATS_TOKEN",
              "PYHAMI_NATS_NKEY_SEED", "PYHAMI_NATS_CREDS", "PYHAMI_NATS_CA", "PYHAMI_NATS_CERT",
              "PYHAMI_NATS_KEY", "PYHAMI_NATS_RECONNECT_MAX_WAIT"],
}


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand under it, at any depth."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                yield from commands(subparser)


def command(parser: argparse.ArgumentParser, *path: str) -> CommandParser:
    for name in path:
        subcommands = next(a for a in parser._actions
                           if isinstance(a, argparse._SubParsersAction))
        parser = subcommands.choices[name]
    assert isinstance(parser, CommandParser)
    return parser


def parse(environ: dict[str, str], *argv: str) -> argparse.Namespace:
    return build_parser(environ).parse_args(list(argv))


def refusal(capsys: pytest.CaptureFixture[str], environ: dict[str, str], *argv: str) -> str:
    """The error line argparse prints for ``argv`` under ``environ``; it must exit 2."""
    with pytest.raises(SystemExit) as stopped:
        parse(environ, *argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def pyhami(*args: str | Path, environ: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("PYHAMI_") and name != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "pyhami.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**clean, **(environ or {})})


class TestEnvironmentRule:
    def test_every_option_of_every_subcommand_has_its_variable(self) -> None:
        checked = 0
        for parser in commands(build_parser({})):
            assert isinstance(parser, CommandParser), parser.prog
            served = {fallback.action: fallback.variable for fallback in parser.fallbacks}
            for action in parser._actions:
                if not action.option_strings or isinstance(
                        action, argparse._HelpAction | argparse._VersionAction):
                    continue
                flag = next(o for o in action.option_strings if o.startswith("--"))
                variable = "PYHAMI_" + flag[2:].upper().replace("-", "_")
                assert served.get(action) == variable, f"{parser.prog} {flag}"
                assert f"${variable}" in (action.help or ""), f"{parser.prog} {flag}"
                checked += 1
            if parser.fallbacks:
                assert parser.epilog and "PYHAMI_<OPTION>" in parser.epilog, parser.prog
        assert checked > 50  # the walk reached the subcommands, nested ones included

    @pytest.mark.parametrize("name", ["scheduler", "agent"])
    def test_the_variables_of_today_keep_their_names(self, name: str) -> None:
        variables = {f.variable for f in command(build_parser({}), name).fallbacks}
        assert set(KEPT_VARIABLES[name]) <= variables
        assert "PYHAMI_NATS" in variables and "PYHAMI_LOG_FORMAT" in variables

    def test_variables_fill_in_through_the_options_types_and_the_command_line_wins(
            self) -> None:
        environ = {"PYHAMI_NODE_TIMEOUT": "12", "PYHAMI_LISTEN": "127.0.0.1:9000",
                   "PYHAMI_STANDALONE": "Yes", "PYHAMI_NODE_SCHEDULER_POLICY": "spread",
                   "PYHAMI_RESYNC_WAIT": ""}
        args = parse(environ, "scheduler")
        assert args.node_timeout == 12.0 and args.listen == ("127.0.0.1", 9000)
        assert args.standalone is True and args.node_scheduler_policy == "spread"
        assert args.resync_wait == 2.0  # empty counts as unset
        args = parse(environ, "scheduler", "--node-timeout", "5", "--listen", ":7000")
        assert args.node_timeout == 5.0 and args.listen == ("0.0.0.0", 7000)

    @pytest.mark.parametrize(("text", "value"), [
        ("true", True), ("1", True), ("yes", True), ("TRUE", True), ("Yes", True),
        ("false", False), ("0", False), ("no", False), ("No", False)])
    def test_switch_values(self, text: str, value: bool) -> None:
        assert parse({"PYHAMI_NO_PENDING_LOOP": text}, "scheduler").no_pending_loop is value

    @pytest.mark.parametrize("text", ["on", "2", "maybe", "y"])
    def test_another_switch_value_is_refused_naming_the_variable(
            self, capsys: pytest.CaptureFixture[str], text: str) -> None:
        line = refusal(capsys, {"PYHAMI_EXPLAIN": text}, "decide", "--cluster", "c", "--pod", "p")
        assert line == (f"pyhami decide: error: PYHAMI_EXPLAIN (for --explain): {text!r} is not "
                        "a switch value (use true/1/yes or false/0/no)")

    @pytest.mark.parametrize(("path", "flag", "text"), [
        (["scheduler"], "--node-timeout", "soon"),
        (["scheduler"], "--group-turn", "-5"),
        (["scheduler"], "--filter-nodes", "best"),
        (["scheduler"], "--listen", "8888"),
        (["scheduler"], "--log-format", "xml"),
        (["scheduler"], "--gpu-scheduler-policy", "fastest"),
        (["agent"], "--inventory", "sim:v100x2"),
        (["watch"], "--decisions", "0"),
        (["bench", "decide"], "--seed", "many"),
    ])
    def test_a_bad_variable_gets_the_command_lines_error_naming_the_variable(
            self, capsys: pytest.CaptureFixture[str], path: list[str], flag: str,
            text: str) -> None:
        prog = "pyhami " + " ".join(path)
        on_the_line = refusal(capsys, {}, *path, flag, text)
        assert on_the_line.startswith(f"{prog}: error: argument {flag}: ")
        variable = variable_for(flag)
        in_a_variable = refusal(capsys, {variable: text}, *path)
        assert in_a_variable == (f"{prog}: error: {variable} (for {flag}): "
                                 + on_the_line.removeprefix(f"{prog}: error: argument {flag}: "))

    def test_required_options_may_come_from_variables(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        args = parse({"PYHAMI_CLUSTER": str(LAB), "PYHAMI_POD": "pod.yaml"}, "decide")
        # --pod may be repeated (several pods, groups): a list, from the variable too.
        assert (args.cluster, args.pod) == (LAB, [Path("pod.yaml")])
        assert refusal(capsys, {}, "decide", "--pod", "p") == (
            "pyhami decide: error: the following arguments are required: "
            "--cluster (or PYHAMI_CLUSTER)")
        assert refusal(capsys, {}, "bench", "decide") == (
            "pyhami bench decide: error: the following arguments are required: "
            "--nodes (or PYHAMI_NODES)")

    def test_a_required_group_may_be_met_by_a_variable(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        assert parse({"PYHAMI_DAEMON": "http://d:8888"}, "explain", "p.yaml").daemon == (
            "http://d:8888")
        assert refusal(capsys, {}, "explain", "p.yaml") == (
            "pyhami explain: error: one of the arguments --daemon --cluster is required "
            "(or one of PYHAMI_DAEMON, PYHAMI_CLUSTER)")

    def test_a_variable_and_an_option_of_one_exclusive_group_are_refused_together(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        assert refusal(capsys, {"PYHAMI_STANDALONE": "true"}, "scheduler",
                       "--kubeconfig", "k") == (
            "pyhami scheduler: error: --kubeconfig: not allowed with --standalone "
            "(from PYHAMI_STANDALONE)")
        assert refusal(capsys, {"PYHAMI_STANDALONE": "1", "PYHAMI_IN_CLUSTER": "1"},
                       "scheduler") == (
            "pyhami scheduler: error: --in-cluster (from PYHAMI_IN_CLUSTER): not allowed with "
            "--standalone (from PYHAMI_STANDALONE)")
        # A switch set false by its variable is no choice: the command line's stands.
        assert parse({"PYHAMI_STANDALONE": "false"}, "scheduler", "--in-cluster").in_cluster

    def test_a_renamed_variable_is_refused_rather_than_ignored(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        assert refusal(capsys, {"PYHAMI_NATS_URL": "nats://n:4222"}, "agent", "--node", "n") == (
            "pyhami agent: error: PYHAMI_NATS_URL is no longer read: set PYHAMI_NATS instead")
        # Only where --nats exists.
        assert parse({"PYHAMI_NATS_URL": "nats://n:4222"}, "decide", "--cluster", "c",
                     "--pod", "p").cluster == Path("c")

    def test_an_option_the_rule_cannot_serve_is_refused_when_the_rule_is_applied(self) -> None:
        parser = CommandParser(prog="tool")
        parser.add_argument("--verbose", action="count")
        with pytest.raises(TypeError, match="--verbose: the environment rule serves"):
            use_environment(parser, {})

    def test_a_repeatable_options_variable_holds_its_values_separated_by_spaces(
            self, capsys: pytest.CaptureFixture[str]) -> None:
        def tool(environ: dict[str, str]) -> CommandParser:
            parser = CommandParser(prog="tool")
            parser.add_argument("--tag", action="append", type=int, required=True)
            use_environment(parser, environ)
            return parser

        assert tool({"PYHAMI_TAG": " 3  5 "}).parse_args([]).tag == [3, 5]
        # The command line replaces the variable's values rather than adding to them.
        assert tool({"PYHAMI_TAG": "3 5"}).parse_args(["--tag", "7", "--tag", "8"]).tag == [7, 8]
        with pytest.raises(SystemExit):
            tool({"PYHAMI_TAG": "3 x"}).parse_args([])
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "tool: error: PYHAMI_TAG (for --tag): invalid int value: 'x'")
        with pytest.raises(SystemExit):
            tool({"PYHAMI_TAG": "  "}).parse_args([])  # blank counts as unset
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "tool: error: the following arguments are required: --tag (or PYHAMI_TAG)")

    def test_a_whole_command_from_the_environment(self) -> None:
        done = pyhami("decide", environ={
            "PYHAMI_CLUSTER": str(LAB), "PYHAMI_POD": str(EXAMPLES / "mutex-binpack-pod.yaml"),
            "PYHAMI_EXPLAIN": "true", "PYHAMI_OUTPUT": "table"})
        assert done.returncode == 0, done.stderr
        assert "<- chosen" in done.stdout and "-> GPU 2 on gpu-node-1" in done.stdout


def write_pod(path: Path, limits: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"metadata": {"name": path.stem}, "spec": {"containers": [
        {"name": "app", "resources": {"limits": limits}}]}}))
    return path


@pytest.fixture
def pods(tmp_path: Path) -> dict[str, Path]:
    return {
        "scheduled": EXAMPLES / "mutex-binpack-pod.yaml",
        "pending": write_pod(tmp_path / "five.json", {"nvidia.com/gpu": 5}),  # of 4 cards
        "rejected": write_pod(tmp_path / "odd.json", {"nvidia.com/gpumem": "lots"}),
        "no-gpu": write_pod(tmp_path / "web.json", {"cpu": 1}),
    }


def options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """Every option and argument a user reads in ``--help``, named as ``pyhami X --flag``."""
    for command_parser in commands(parser):
        for action in command_parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction |
                          argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            name = action.option_strings[-1] if action.option_strings else action.metavar
            yield f"{command_parser.prog} {name}", action


class TestHelp:
    def test_every_option_says_what_it_means_and_its_default(self) -> None:
        checked = 0
        for name, action in options(build_parser({})):
            meaning = (action.help or "").split("[$PYHAMI_")[0].strip()
            assert meaning, f"{name}: no help"
            given = action.default not in (None, False, "", (), [])
            if given and not isinstance(action, argparse._StoreTrueAction):
                assert "default" in meaning.lower(), f"{name}: default {action.default!r} " \
                    "not shown"
            checked += 1
        assert checked > 150  # the walk reached every subcommand, nested ones included

    def test_no_help_text_speaks_of_the_project_s_issues(self) -> None:
        for parser in commands(build_parser({})):
            texts = [parser.description or "", parser.epilog or "",
                     *(action.help or "" for action in parser._actions),
                     *(choice.help or "" for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction)
                       for choice in action._choices_actions)]
            for text in texts:
                assert not re.search(r"\bissues? #?\d", text), f"{parser.prog}: {text}"

    def test_pyhami_output_is_only_ever_the_table_or_json_switch(self) -> None:
        for name, action in options(build_parser({})):
            if "--output" in action.option_strings:
                assert set(action.choices or ()) == {"table", "json"}, name


class TestOutput:
    @pytest.mark.parametrize("case", ["scheduled", "pending", "rejected", "no-gpu"])
    def test_decide_and_explain_agree_in_both_outputs(self, pods: dict[str, Path],
                                                     case: str) -> None:
        decide_table = pyhami("decide", "--cluster", LAB, "--pod", pods[case], "--explain",
                              "--output", "table")
        explain_table = pyhami("explain", pods[case], "--cluster", LAB)
        assert decide_table.returncode == explain_table.returncode == 0, decide_table.stderr
        assert decide_table.stdout == explain_table.stdout
        assert decide_table.stdout.strip()
        decide_json = pyhami("decide", "--cluster", LAB, "--pod", pods[case], "--explain")
        explain_json = pyhami("explain", pods[case], "--cluster", LAB, "-o", "json")
        assert json.loads(decide_json.stdout) == json.loads(explain_json.stdout)

    def test_the_tables_say_what_happened(self, pods: dict[str, Path]) -> None:
        def table(case: str) -> str:
            done = pyhami("decide", "--cluster", LAB, "--pod", pods[case], "-o", "table")
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert table("scheduled") == "-> GPU 2 on gpu-node-1\n"
        document = json.loads(pyhami("decide", "--cluster", LAB, "--pod", pods["pending"]).stdout)
        # The sentence the pod's FilteringFailed summary would end with, HAMi's reason in it.
        assert document["failed_nodes"]["gpu-node-1"] == "4/4 NodeInsufficientDevice"
        assert "(NodeInsufficientDevice)" in document["message"]
        assert table("pending") == f"-> Pending: {document['message']}\n"
        # The reason's brackets are text, not markup.
        assert table("rejected") == (
            "not schedulable: spec.containers[0].resources.limits[nvidia.com/gpumem]: 'lots' is "
            "not a quantity; HAMi would drop container app's GPU request without a word\n")
        assert table("no-gpu") == ("the pod asks for no GPU: pyhami passes every node and "
                                   "leaves the choice to kube-scheduler\n")

    def test_in_a_pipe_a_line_is_as_long_as_it_needs(self, tmp_path: Path,
                                                      pods: dict[str, Path]) -> None:
        cluster = json.loads(LAB.read_text())
        long_name = "gpu-node-in-rack-17-row-b-of-the-second-data-hall-" + "x" * 60
        cluster["nodes"][0]["name"] = long_name
        for pod in cluster["pods"]:
            pod["node"] = long_name
        path = tmp_path / "cluster.json"
        path.write_text(json.dumps(cluster))
        done = pyhami("explain", pods["pending"], "--cluster", path)
        assert done.returncode == 0, done.stderr
        message = json.loads(pyhami("decide", "--cluster", path, "--pod", pods["pending"])
                             .stdout)["message"]
        assert long_name in message
        line = f"-> Pending: {message}"
        assert line in done.stdout.splitlines()
        assert len(line) > 120
        assert "\x1b[" not in done.stdout  # no colours in a pipe


class TestNoGpu:
    def test_decide_says_the_pod_asks_for_no_gpu(self, pods: dict[str, Path]) -> None:
        done = pyhami("decide", "--cluster", LAB, "--pod", pods["no-gpu"])
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "scheduled": True, "gpu": False, "node": None, "devices": [], "annotations": {},
            "failed_nodes": {}, "ignored_policies": [], "warnings": [],
            "note": "the pod asks for no GPU: pyhami passes every node and leaves the choice "
                    "to kube-scheduler"}
        gpu_pod = pyhami("decide", "--cluster", LAB, "--pod", pods["scheduled"])
        assert json.loads(gpu_pod.stdout)["gpu"] is True
        assert "note" not in json.loads(gpu_pod.stdout)

    async def test_the_daemon_passes_every_node_and_explains_it_the_same_way(
            self, lab: Lab, http: aiohttp.ClientSession, tmp_path: Path) -> None:
        pod = lab_pod("web", limits={"cpu": 1})
        args = {"Pod": pod, "NodeNames": ["gpu-node-1", "cpu-node-1"]}
        async with http.post(f"{lab.daemon.url}/filter", json=args) as response:
            assert response.status == 200
            assert (await response.json())["NodeNames"] == ["gpu-node-1", "cpu-node-1"]
        path = tmp_path / "web.json"
        path.write_text(json.dumps(pod))
        explain = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pyhami.cli", "explain", str(path), "--daemon",
            lab.daemon.url, "-o", "json", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(explain.communicate(), 30)
        assert explain.returncode == 0, err.decode()
        document = json.loads(out)
        assert (document["scheduled"], document["gpu"], document["node"]) == (True, False, None)
        assert "kube-scheduler" in document["note"]


class TestJsonLogs:
    def test_a_record_with_an_exception_carries_its_traceback(self) -> None:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(JsonFormatter())
        log = logging.getLogger("pyhami.test.jsonlogs")
        log.addHandler(handler)
        log.propagate = False
        try:
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("could not %s", "decide")
            log.warning("plain")
        finally:
            log.removeHandler(handler)
        failed, plain = (json.loads(line) for line in out.getvalue().splitlines())
        assert failed["message"] == "could not decide" and failed["level"] == "ERROR"
        assert failed["logger"] == "pyhami.test.jsonlogs"
        assert failed["exception"].startswith("Traceback") and "ValueError: boom" in (
            failed["exception"])
        assert plain["message"] == "plain" and "exception" not in plain
        assert plain["time"].endswith("+00:00")

    async def test_the_scheduler_logs_one_json_object_per_line(
            self, jetstream_server: LocalNatsServer) -> None:
        clean = {n: v for n, v in os.environ.items() if not n.startswith("PYHAMI_")}
        daemon = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pyhami.cli", "scheduler", "--standalone",
            "--nats", jetstream_server.url, "--listen", f"127.0.0.1:{free_port()}",
            "--metrics", f"127.0.0.1:{free_port()}", "--resync-wait", "0.2",
            stderr=asyncio.subprocess.PIPE,
            env={**clean, "PYHAMI_LOG_FORMAT": "json", "PYHAMI_LOG_LEVEL": "debug"})
        assert daemon.stderr is not None
        lines: list[bytes] = []
        try:
            while not any(b"ready" in line for line in lines):
                line = await asyncio.wait_for(daemon.stderr.readline(), 30)
                assert line, b"".join(lines).decode()
                lines.append(line)
            daemon.send_signal(signal.SIGTERM)
            _, rest = await asyncio.wait_for(daemon.communicate(), 30)
        finally:
            if daemon.returncode is None:
                daemon.kill()
                await daemon.wait()
        assert daemon.returncode == 0
        records = [json.loads(line) for line in (b"".join(lines) + (rest or b"")).splitlines()]
        assert all(set(r) >= {"time", "level", "logger", "message"} for r in records)
        assert any(r["message"].startswith("pyhami scheduler ready on 127.0.0.1:")
                   and r["level"] == "INFO" and r["logger"] == "scheduler.daemon" for r in records)
        assert any(r["message"] == "SIGTERM received: stopping" for r in records)
