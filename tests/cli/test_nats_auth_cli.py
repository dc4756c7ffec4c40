"""``pyhami nats-auth``: credentials written whole, never over existing ones by accident."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import nats
import nats.errors
import nkeys
import pytest

from common.busaccess import DAEMON_USER, BusCredentials
from common.core.errors import SettingsError
from common.natsjwt import node_of_token
from pyhami.cli import build_parser, main
from pyhami.natsserver import LocalNatsServer, free_port
from scheduler.cli import config_from


def test_init_writes_secret_files_and_a_config_naming_the_issuer(tmp_path: Path) -> None:
    assert main(["nats-auth", "init", str(tmp_path / "auth")]) == 0
    files = {path.name: path for path in (tmp_path / "auth").iterdir()}
    assert set(files) == {"issuer.seed", "issuer.pub", "daemon.password", "watch.password",
                          "nats.conf"}
    for path in files.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = {name: path.read_bytes() for name, path in files.items()}
    credentials = BusCredentials.from_stored(stored, "test")
    assert credentials.issuer == stored["issuer.pub"].decode().strip()
    config = stored["nats.conf"].decode()
    assert credentials.issuer in config and credentials.daemon_password in config


def test_init_refuses_to_replace_and_keeps_a_complete_set(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory)]) == 0
    seed = (directory / "issuer.seed").read_bytes()
    assert main(["nats-auth", "init", str(directory)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["nats-auth", "init", str(directory), "--keep-existing"]) == 0
    assert (directory / "issuer.seed").read_bytes() == seed
    assert main(["nats-auth", "init", str(directory), "--force"]) == 0
    assert (directory / "issuer.seed").read_bytes() != seed


def test_agent_token_names_its_node_and_refuses_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory)]) == 0
    seed = str(directory / "issuer.seed")
    out = tmp_path / "node.token"
    assert main(["nats-auth", "agent-token", "--issuer-seed", seed, "--node", "gpu-1",
                 "--token-file", str(out)]) == 0
    issuer = (directory / "issuer.pub").read_text().strip()
    assert node_of_token(out.read_text().strip(), issuer, int(time.time())) == "gpu-1"
    capsys.readouterr()
    for args, named in ((["--node", "a.>"], "node"), (["--node", "n", "--days", "0"], "--days"),
                        (["--node", "n", "--issuer-seed", str(tmp_path / "none")],
                         "--issuer-seed")):
        full = ["nats-auth", "agent-token", "--issuer-seed", seed, *args]
        assert main(full) == 2
        assert named in capsys.readouterr().err


def test_agent_token_signs_with_the_folder_init_wrote_as_the_docs_write_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory)]) == 0
    issuer = (directory / "issuer.pub").read_text().strip()
    capsys.readouterr()
    # PYHAMI_OUTPUT is every command's table/json switch: it must not name a token file.
    monkeypatch.setenv("PYHAMI_OUTPUT", "json")
    monkeypatch.chdir(tmp_path)
    assert main(["nats-auth", "agent-token", str(directory), "--node", "gpu-node-1"]) == 0
    printed = capsys.readouterr().out.strip()
    assert node_of_token(printed, issuer, int(time.time())) == "gpu-node-1"
    assert not (tmp_path / "json").exists()
    # Without DIR, the current folder is the one init wrote.
    monkeypatch.chdir(directory)
    assert main(["nats-auth", "agent-token", "--node", "gpu-node-2"]) == 0
    assert node_of_token(capsys.readouterr().out.strip(), issuer,
                         int(time.time())) == "gpu-node-2"
    monkeypatch.chdir(tmp_path)
    assert main(["nats-auth", "agent-token", "--node", "gpu-node-1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "issuer.seed" in error and "nats-auth init" in error


@pytest.mark.parametrize(("options", "expected"), [
    ([], ["nats-server --config {d}/nats.conf --jetstream --store_dir {d}/jetstream",
          "pyhami scheduler --standalone --nats nats://127.0.0.1:4222 --nats-auth-dir {d}",
          "pyhami nats-auth agent-token {d} --node NODE --token-file NODE.token",
          "pyhami agent --node NODE --nats nats://127.0.0.1:4222 --nats-token-file NODE.token"
          " --inventory nvml"]),
    (["--agents", "sim-t4", "--cluster", "3"],
     ["nats-server --config {d}/nats-3.conf --jetstream --store_dir {d}/jetstream-3 "
      "--port 4224",
      "pyhami agent --node sim-t4 --nats nats://127.0.0.1:4222,nats://127.0.0.1:4223,"
      "nats://127.0.0.1:4224 --nats-token-file {d}/sim-t4.token --inventory nvml"]),
])
def test_init_says_what_to_run_next(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    options: list[str], expected: list[str]) -> None:
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory), *options]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "Next (docs/security.md):" in lines
    for line in expected:
        assert line.format(d=directory) in lines


def test_agent_token_has_no_output_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["nats-auth", "agent-token", "--node", "n", "--output", "t"])
    assert stopped.value.code == 2
    assert "--output" in capsys.readouterr().err


def test_the_daemon_refuses_auth_settings_that_do_not_fit(tmp_path: Path) -> None:
    user_seed = tmp_path / "user-seed"
    assert main(["nats-auth", "init", str(user_seed)]) == 0
    (user_seed / "issuer.seed").write_bytes(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))
    incomplete = tmp_path / "incomplete"
    assert main(["nats-auth", "init", str(incomplete)]) == 0
    (incomplete / "watch.password").unlink()
    cases = {
        ("--standalone", "--nats-auth-secret", "s"): "Kubernetes Secret",
        ("--standalone", "--nats-auth-dir", str(tmp_path / "missing")): "nats-auth init",
        ("--standalone", "--nats-auth-dir", str(incomplete)): "watch.password",
        ("--standalone", "--nats-auth-dir", str(user_seed)): "account",
        ("--standalone", "--nats-auth-dir", str(user_seed), "--nats-auth-secret", "s"):
            "give one",
    }
    for args, named in cases.items():
        parsed = build_parser({}).parse_args(["scheduler", *args])
        with pytest.raises(SettingsError, match=named):
            config_from(parsed)


def test_init_mints_agent_tokens_and_keeps_them_with_the_set(tmp_path: Path) -> None:
    directory = tmp_path / "auth"
    agents = ["--agents", "sim-t4,sim-a100"]
    assert main(["nats-auth", "init", str(directory), *agents]) == 0
    issuer = (directory / "issuer.pub").read_text().strip()
    first = (directory / "sim-t4.token").read_text().strip()
    assert node_of_token(first, issuer, int(time.time())) == "sim-t4"
    assert main(["nats-auth", "init", str(directory), "--keep-existing",
                 "--agents", "sim-t4,sim-a100,sim-h100"]) == 0
    assert (directory / "sim-t4.token").read_text().strip() == first
    third = (directory / "sim-h100.token").read_text().strip()
    assert node_of_token(third, issuer, int(time.time())) == "sim-h100"
    assert main(["nats-auth", "init", str(directory), "--agents", "a,*"]) == 2


def test_a_folder_that_cannot_be_written_is_named_and_nothing_is_left(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    assert main(["nats-auth", "init", str(tmp_path / "a-file" / "auth")]) == 2
    assert "cannot write the credentials" in capsys.readouterr().err
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory)]) == 0
    capsys.readouterr()
    assert main(["nats-auth", "agent-token", "--issuer-seed", str(directory / "issuer.seed"),
                 "--node", "gpu-1", "--token-file", str(tmp_path / "missing" / "t")]) == 2
    assert "--token-file" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


async def test_init_cluster_writes_three_servers_that_form_one_cluster_with_the_callout(
        tmp_path: Path) -> None:
    routes = [free_port() for _ in range(3)]
    directory = tmp_path / "auth"
    assert main(["nats-auth", "init", str(directory), "--cluster", "3", "--routes",
                 ",".join(f"127.0.0.1:{port}" for port in routes)]) == 0
    configs = [directory / f"nats-{index}.conf" for index in (1, 2, 3)]
    credentials = BusCredentials.read(directory)
    for index, config in enumerate(configs):
        text = config.read_text()
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert f'listen: "127.0.0.1:{routes[index]}"' in text
        assert "auth_callout" in text and credentials.issuer in text
        assert text.count("nats-route://pyhami-route:") == 2  # the two others
    servers = [LocalNatsServer(extra_args=["-c", str(config), "-js", "-sd",
                                           str(tmp_path / f"js-{index}")])
               for index, config in enumerate(configs)]
    for server in servers:
        server.start()
    try:
        # The daemon's user on the third server makes a bucket kept by all three: the
        # cluster formed, routes authenticated, and JetStream has a meta leader.
        client = await nats.connect(servers=[servers[2].url], user=DAEMON_USER,
                                    password=credentials.daemon_password)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    bucket = await client.jetstream().create_key_value(
                        bucket="formed", history=1, replicas=3)
                    break
                except nats.errors.Error:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert (await bucket.status()).stream_info.config.num_replicas == 3
        finally:
            await client.close()
    finally:
        for server in servers:
            server.kill()


@pytest.mark.parametrize(("flags", "named"), [
    (["--cluster", "3", "--routes", "a:6222,b:6222"], "--routes: 2 entries for --cluster 3"),
    (["--cluster", "3", "--routes", "a:1,a:1,b:2"], "--routes: an entry is given twice"),
    (["--routes", "a:1,b:2,c:3"], "--routes needs --cluster"),
], ids=["too-few-routes", "route-twice", "routes-without-cluster"])
def test_init_cluster_refuses_routes_that_do_not_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        named: str) -> None:
    assert main(["nats-auth", "init", str(tmp_path / "auth"), *flags]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "auth").exists()


@pytest.mark.parametrize("flags", [["--cluster", "2"], ["--cluster", "3", "--routes", "a:x"]],
                         ids=["even-cluster", "route-without-port"])
def test_init_cluster_refuses_a_size_or_route_argparse_cannot_take(
        tmp_path: Path, flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["nats-auth", "init", str(tmp_path / "auth"), *flags])
    assert exit_.value.code == 2
