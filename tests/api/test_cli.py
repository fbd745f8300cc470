"""The `gpupool` CLI: arguments, output, exit codes (2 usage, 1 refused, 3 unreachable)."""

from __future__ import annotations

import json
import socket

import pytest

from gpupool.cli import main as cli

from .fake_core import ADMIN_TOKEN, FakeCore
from .servers import AppServer


@pytest.fixture(scope="module")
def server():
    srv = AppServer(FakeCore())
    yield srv
    srv.close()


@pytest.fixture
def env(monkeypatch, tmp_path, server):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_URL", server.url)
    monkeypatch.setenv("GPUPOOL_TOKEN", "alice-token")
    return server


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("text", "value"), [("20GiB", 20 * 2**30), ("20G", 20 * 10**9), ("20gb", 20 * 10**9),
                                             ("512MiB", 512 * 2**20), ("1024", 1024), ("1.5Gi", 3 * 2**29),
                                             (" 2 TiB ", 2 * 2**40)])
def test_parse_size(text, value):
    assert cli.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "20XB", "0", "1.2.3G"])
def test_parse_size_refuses(text):
    with pytest.raises(Exception, match="size"):
        cli.parse_size(text)


def test_submit_spec_from_arguments(tmp_path):
    args = cli.build_parser().parse_args(
        ["submit", "--project", "vision", "--gpu-memory", "20GiB", "--gpu-model", "A100-80GB", "--priority", "3",
         "--name", "sweep", "--workdir", str(tmp_path), "--env", "A=1", "--label", "nb=x.ipynb",
         "--image", "registry.example/x:2"])
    spec = cli.submit_spec(args, ["python", "train.py", "--lr", "0.1"])
    assert spec == {"project": "vision", "name": "sweep", "gpu_memory": 20 * 2**30, "gpu_model": "A100-80GB",
                    "priority": 3, "workdir": str(tmp_path), "env": {"A": "1"}, "labels": {"nb": "x.ipynb"},
                    "image": "registry.example/x:2", "command": ["python", "train.py", "--lr", "0.1"]}


def test_submit_spec_with_placement_rules():
    args = cli.build_parser().parse_args(
        ["submit", "--project", "vision", "--gpus", "1", "--node-selector", "gpu=h100", "--node-selector", "zone=a",
         "--toleration", "dedicated=inference:NoSchedule", "--toleration", "spot", "--toleration", "maint:NoExecute"])
    spec = cli.submit_spec(args, ["python", "train.py"])
    assert spec["node_selector"] == {"gpu": "h100", "zone": "a"}
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"}, {"key": "maint", "operator": "Exists", "effect": "NoExecute"}]
    from gpupool.wire.placement import check_placement
    from gpupool.wire.schemas import validate
    check_placement(validate("JobSpec", spec, "job spec"))  # what the flags make, the wire model takes


@pytest.mark.parametrize("argv", [
    ["submit", "--project", "p", "--gpus", "1", "--toleration", "a=b:Sometimes", "--", "x"],
    ["submit", "--project", "p", "--gpus", "1", "--node-selector", "gpu", "--", "x"],
    ["submit", "--project", "p", "--gpus", "1", "--gpu-fraction", "0.5", "--", "x"],  # both
    ["submit", "--gpus", "1", "--", "x"],  # no project
    ["submit", "--project", "p", "--gpus", "two", "--", "x"],
    ["submit", "--project", "p", "--gpu-memory", "lots", "--", "x"],
    ["frobnicate"],
    [],
    ["logs"],
    ["status", "--", "x"],
    ["submit", "--project", "p", "--gpus", "1"],  # no command
    ["submit", "--project", "p", "--gpu-fraction", "1.5", "--", "x"],
    ["submit", "--project", "p", "--gpus", "0", "--", "x"],
    ["tokens"],
])
def test_usage_errors_exit_2_with_one_line(env, capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2, (argv, err)
    assert err.startswith("gpupool: error: ") and err.count("\n") == 1, err
    assert out == ""


def test_server_refusal_exits_1_with_server_message(env, capsys):
    code, out, err = run(capsys, "submit", "--project", "nope", "--gpus", "1", "--", "true")
    assert code == 1 and err == "gpupool: error: unknown project 'nope'\n"
    code, out, err = run(capsys, "describe", "j-424242")
    assert code == 1 and "no job 'j-424242'" in err
    code, out, err = run(capsys, "projects", "set", "x", "--guarantee", "2")
    assert code == 1 and "only the admin" in err
    code, out, err = run(capsys, "--token", "bad", "status")
    assert code == 1 and "invalid token" in err


def test_unreachable_exits_3(env, capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("GPUPOOL_URL", f"http://127.0.0.1:{port}")
    code, out, err = run(capsys, "status")
    assert code == 3 and err.startswith(f"gpupool: error: cannot reach the scheduler at http://127.0.0.1:{port}")


def test_read_commands_tables_and_json(env, capsys):
    code, out, err = run(capsys, "submit", "--project", "vision", "--gpu-fraction", "0.25", "--name", "exp1",
                         "--", "python", "-c", "print(1)")
    assert code == 0 and out.startswith("j-") and "queued" in out
    job_id = out.split()[0]
    code, out, _ = run(capsys, "status")
    assert code == 0 and "SIMULATED" in out and "A100-80GB" in out and "vision" in out
    code, out, _ = run(capsys, "status", "--json")
    assert json.loads(out)["simulated"] is True
    code, out, _ = run(capsys, "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "PROJECT"] and job_id in out
    code, out, _ = run(capsys, "list", "--json", "--all")
    assert job_id in [j["id"] for j in json.loads(out)]
    code, out, _ = run(capsys, "describe", job_id)
    assert code == 0 and f"id:               {job_id}" in out and "exp1" in out
    code, out, _ = run(capsys, "describe", job_id, "--json")
    assert json.loads(out)["id"] == job_id
    code, out, _ = run(capsys, "projects")
    assert code == 0 and "PROJECT" in out and "vision" in out
    code, out, _ = run(capsys, "projects", "--json")
    assert "vision" in [p["name"] for p in json.loads(out)]
    code, out, _ = run(capsys, "logs", job_id)
    assert code == 0 and out == "hello\n"
    code, out, _ = run(capsys, "whoami")
    assert out.startswith("alice")
    code, out, _ = run(capsys, "cancel", job_id)
    assert code == 0 and out.startswith(f"{job_id} cancelled")
    code, out, _ = run(capsys, "logs", job_id, "-f")  # a finished job: follow ends at the end of its log
    assert code == 0 and out == "hello\n"
    code, out, err = run(capsys, "cancel", job_id)
    assert code == 1 and "already cancelled" in err


def test_admin_commands(env, capsys, monkeypatch):
    monkeypatch.setenv("GPUPOOL_TOKEN", ADMIN_TOKEN)
    code, out, err = run(capsys, "projects", "set", "nlp", "--build-quota", "1.5", "--guarantee", "2",
                         "--limit", "4", "--weight", "1", "--json")
    assert code == 0, err
    assert {k: json.loads(out)[k] for k in ("build_quota", "train_guarantee", "train_limit", "weight")} == \
        {"build_quota": 1.5, "train_guarantee": 2, "train_limit": 4, "weight": 1}
    code, out, _ = run(capsys, "projects", "set", "nlp", "--limit", "none", "--json")
    assert json.loads(out)["train_limit"] is None and json.loads(out)["train_guarantee"] == 2
    code, out, err = run(capsys, "tokens", "create", "erin")
    assert code == 0 and out.strip() and "erin" in err
    code, out, _ = run(capsys, "projects", "delete", "nlp")
    assert code == 0 and "deleted" in out


def test_serve_banner_names_url_simulation_and_token_file(tmp_path):
    from .servers import ServeProcess, gpupool

    srv = ServeProcess(tmp_path / "state", tmp_path, simulate="2xA100-80GB", admin_token="",
                       settings={"on_shutdown": "stop"})
    srv.start()
    try:
        banner = "\n".join(srv.banner)
        token_file = tmp_path / "state" / "admin_token"
        assert "with SIMULATED GPUs" in banner and f"in {token_file}" in banner and srv.url in banner
        import os
        import pwd

        me = pwd.getpwuid(os.geteuid()).pw_name
        assert f"jobs run as: {me}, this service's own account: every token holder's jobs can read" in banner
        result = gpupool(["status"], srv.env(token_file.read_text().strip()))
        assert result.returncode == 0 and "SIMULATED" in result.stdout and "A100-80GB" in result.stdout
    finally:
        assert srv.stop() == 0


def test_events_command_pages_through_events(env, capsys):
    code, out, err = run(capsys, "submit", "--project", "vision", "--name", "ev", "--", "true")
    assert code == 0, err
    job_id = out.split()[0]
    code, out, _ = run(capsys, "events")
    assert code == 0 and any(job_id in line and "queued" in line and "vision/alice" in line
                             for line in out.splitlines())
    code, out, _ = run(capsys, "events", "--json", "--since", "0")
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events) and job_id in {e["job_id"] for e in events}


def test_serve_on_a_busy_port_is_one_line_and_exit_1(tmp_path):
    import subprocess
    import sys

    from .servers import cli_env

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "gpupool", "serve", "--state-dir", str(tmp_path / "s"),
                                 "--port", str(port), "--simulate", "1xA100-80GB"],
                                env=cli_env("", None, tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"gpupool: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert not (tmp_path / "s" / "state.db").exists()  # nothing started


def test_connection_options_work_before_or_after_the_command(env, capsys, monkeypatch):
    monkeypatch.delenv("GPUPOOL_TOKEN")
    monkeypatch.setenv("GPUPOOL_URL", "http://127.0.0.1:9")  # wrong on purpose: the options must win
    code, out, err = run(capsys, "whoami", "--url", env.url, "--token", "alice-token")
    assert code == 0 and out.startswith("alice"), err
    code, out, err = run(capsys, "--url", env.url, "--token", ADMIN_TOKEN, "projects", "set", "ml", "--weight", "2",
                         "--json")
    assert code == 0 and json.loads(out)["weight"] == 2, err
    code, out, err = run(capsys, "tokens", "create", "zed", "--url", env.url, "--token", ADMIN_TOKEN)
    assert code == 0 and out.strip(), err


def test_tables_render_what_people_need():
    from gpupool.cli import tables as t

    pool = {"simulated": False, "nodes": [{"name": "n1", "gpus": [
        {"index": 0, "model": "H100", "memory": 80 * 2**30, "allocated": 0.75, "utilization": 37.0,
         "allocations": [{"job_id": "j-000001", "project": "vision", "user": "alice", "fraction": 0.5},
                         {"job_id": "j-000002", "project": "nlp", "user": "bob", "fraction": 0.25}]},
        {"index": 1, "model": "H100", "memory": 80 * 2**30, "allocated": 0, "allocations": []}]}]}
    status = {"simulated": False, "pool": pool, "queue": {"pending": 3, "running": 2, "paused": 1},
              "projects": [{"name": "vision", "build_quota": 1.5, "train_guarantee": 2, "train_limit": None,
                            "weight": 1, "usage": {"build": 0.5, "train": 3, "train_over_quota": 1}, "pending": 2}]}
    text = t.status_text("http://s", status)
    assert "SIMULATED" not in text and "0.75 of 2 allocated" in text and "3 pending, 2 running, 1 paused" in text
    assert "j-000001 vision/alice 0.5, j-000002 nlp/bob 0.25" in text and "37%" in text and "idle" in text
    assert "0.5/1.5" in text and "3/2" in text and "none" in text
    assert "SIMULATED" in t.status_text("http://s", {**status, "simulated": True})
    assert t.request_text({"request": {"gpu_memory": 20 * 2**30, "gpu_model": "A100-80GB"}}) == "20GiB GPU A100-80GB"
    assert t.request_text({"request": {"gpus": 0, "gpu_fraction": 0.25}}) == "0.25 GPU"
    assert t.request_text({"request": {}}) == "CPU"
    assert t.jobs_table([]) == "no jobs" and t.projects_table([]) == "no projects"
    assert t.duration(59) == "59s" and t.duration(3700) == "1h01m" and t.duration(90000) == "1d1h"


def test_login_checks_then_saves_the_client_config(env, capsys, monkeypatch, tmp_path):
    import stat

    config = tmp_path / "xdg" / "gpupool" / "client.json"
    code, out, err = run(capsys, "login", "--token", "wrong")
    assert code == 1 and "invalid token" in err and not config.exists()
    code, out, err = run(capsys, "login")
    assert code == 0 and "as alice" in out, err
    assert json.loads(config.read_text()) == {"url": env.url, "token": "alice-token"}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    monkeypatch.delenv("GPUPOOL_URL")
    monkeypatch.delenv("GPUPOOL_TOKEN")
    code, out, err = run(capsys, "whoami")  # from the saved config alone
    assert code == 0 and out.startswith("alice"), err
    code, out, err = run(capsys, "--token", "", "login")
    assert code == 0  # an empty --token falls back to the saved one


def _gpupool_command() -> list[str]:
    """The installed `gpupool` script next to this Python (what users run), else `python -m gpupool`."""
    import os
    import sys

    script = os.path.join(os.path.dirname(sys.executable), "gpupool")
    return [script] if os.path.isfile(script) else [sys.executable, "-m", "gpupool"]


def test_cli_finds_the_embedded_scheduler_with_no_flags(tmp_path, monkeypatch):
    """The scheduler inside Lab listens on a random port; `gpupool` finds it through its runtime file."""
    import subprocess

    from .servers import EmbeddedThread, cli_env

    runtime = tmp_path / "runtime"
    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(runtime))  # read by the scheduler when it starts
    env = cli_env("", None, tmp_path)
    del env["GPUPOOL_URL"]
    env["GPUPOOL_RUNTIME_DIR"] = str(runtime)

    def gpupool(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*_gpupool_command(), *argv], env={**env, **extra}, capture_output=True, text=True,
                              timeout=60)

    sched = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", config={"on_shutdown": "stop"},
                           projects={"vision": {"train_guarantee": 2}})
    try:
        result = gpupool("status")
        assert result.returncode == 0, result.stderr
        assert "SIMULATED" in result.stdout and "A100-80GB" in result.stdout
        result = gpupool("whoami")
        assert result.stdout.strip() == f"admin (admin) at {sched.url}", result.stderr
        result = gpupool("submit", "--project", "vision", "--gpus", "1", "--", "sleep", "30")
        job_id = result.stdout.split()[0]
        assert result.returncode == 0 and job_id.startswith("j-"), result.stderr
        assert result.stdout.strip() == (f"{job_id} queued: 1 GPU in project vision as admin; "
                                         f"'gpupool describe {job_id}' shows where it runs")
        # The Jupyter extension publishes its user's own token: CLI jobs are then that user's.
        token = sched.loops.run(_create_token(sched, "dora"))
        sched.scheduler.publish_token(token, user="dora")
        assert gpupool("whoami").stdout.strip() == f"dora at {sched.url}"
        # An explicit URL elsewhere wins, and the runtime file's token does not travel there.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = gpupool("whoami", GPUPOOL_URL=f"http://127.0.0.1:{port}")
        assert result.returncode == 3 and f"127.0.0.1:{port}" in result.stderr
        assert gpupool("--url", sched.url, "whoami").stdout.strip() == f"dora at {sched.url}"  # same URL: its token
        assert gpupool("cancel", job_id, GPUPOOL_TOKEN=sched.admin_token).returncode == 0
    finally:
        sched.close()
    assert list(runtime.iterdir()) == []  # a clean stop withdraws the file


async def _create_token(sched, user: str) -> str:
    from gpupool.client import AsyncGpupoolClient

    return (await AsyncGpupoolClient(sched.url, sched.admin_token).create_token(user))["token"]


def test_version(tmp_path):
    import subprocess

    from .servers import cli_env

    result = subprocess.run([*_gpupool_command(), "--version"], env=cli_env("", None, tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("gpupool ") and result.stdout.split()[1][0].isdigit()


HEAVY = ("tornado", "asyncio", "numpy", "gpupool.service", "gpupool.policy", "gpupool.api", "gpupool.backends",
         "kubernetes", "jupyter_gpupool")


@pytest.mark.parametrize("argv", [["status", "--json"],
                                  ["submit", "--project", "vision", "--gpus", "1", "--json", "--", "true"]])
def test_status_and_submit_import_no_heavy_module(env, tmp_path, argv):
    """A `gpupool status` or `submit` pays its imports on every call: none of the service, the policy, a backend
    (the Kubernetes client), tornado, asyncio or numpy is needed to send one request and print its reply."""
    import subprocess
    import sys

    from .servers import cli_env

    probe = ("import json, sys\n"
             "before = set(sys.modules)\n"
             "from gpupool.cli import main as cli\n"
             f"code = cli.main({argv!r})\n"
             "print(json.dumps({'code': code, 'new': sorted(set(sys.modules) - before)}))\n")
    result = subprocess.run([sys.executable, "-c", probe], env=cli_env(env.url, "alice-token", tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    *reply, last = result.stdout.strip().splitlines()
    report = json.loads(last)
    assert report["code"] == 0 and isinstance(json.loads("\n".join(reply)), dict)
    heavy = [m for m in report["new"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], f"gpupool {argv[0]} imported {heavy}"


def test_nothing_configured_and_nothing_running_says_where_it_looked(env, capsys, monkeypatch, tmp_path):
    from gpupool import client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(client, "DEFAULT_URL", f"http://127.0.0.1:{port}")  # a port nobody listens on
    monkeypatch.delenv("GPUPOOL_URL")
    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(tmp_path / "runtime"))
    code, out, err = run(capsys, "status")
    assert code == 3 and f"none in {tmp_path / 'runtime'}" in err and "scripts/run or gpupool serve" in err
    code, out, err = run(capsys, "--url", f"http://127.0.0.1:{port}", "status")  # a URL given: no hint
    assert code == 3 and "none in" not in err
