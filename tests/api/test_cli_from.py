"""`gpupool submit --from FILE`: many jobs, one process, one connection; every line checked first, every outcome said.

Against a real scheduler (embedded, simulated GPUs). Most runs call the CLI's
``main`` in this process (so the connection it opens can be counted); a few
run it as a real process, reading standard input as a pipeline would.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli import main as cli
from gpupool.cli.submit_from import merged
from gpupool.client import GpupoolClient, connection

from .servers import EmbeddedThread, cli_env


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    """A scheduler with project vision (2 GPUs, both kept busy so new jobs queue) and a token for alice."""
    srv = EmbeddedThread(tmp_path_factory.mktemp("from") / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 2}, "nlp": {"train_guarantee": 0}},
                         config={"min_runtime_s": 3600.0})
    admin = GpupoolClient(srv.url, "admin-t")
    srv.alice = admin.create_token("alice")["token"]
    for _ in range(2):
        admin.submit({"project": "vision", "gpus": 1, "command": ["sleep", "3600"]})
    yield srv
    srv.close()


@pytest.fixture
def env(svc, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_URL", svc.url)
    monkeypatch.setenv("GPUPOOL_TOKEN", svc.alice)
    monkeypatch.chdir(tmp_path)
    return svc


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def jobs_file(path: Path, *lines: object) -> str:
    """A jobs file: dicts as JSON lines, strings as they are (blank lines, comments, mistakes)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def job_count(svc) -> int:
    return len(GpupoolClient(svc.url, "admin-t").jobs(limit=10000))


def test_every_line_is_submitted_in_order_with_the_flags_as_defaults(env, capsys, tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    opened: list[object] = []
    original = connection.Connections._open
    monkeypatch.setattr(connection.Connections, "_open", lambda self, t: opened.append(1) or original(self, t))
    path = jobs_file(tmp_path / "jobs.jsonl",
                     "# a sweep over learning rates",
                     {"name": "lr-1", "command": ["python", "train.py", "--lr", "0.1"], "env": {"LR": "0.1"}},
                     "",
                     {"name": "lr-2", "command": ["python", "train.py", "--lr", "0.2"], "gpu_fraction": 0.5},
                     "   ",
                     {"name": "lr-3", "project": "nlp", "labels": {"sweep": "b"}, "workdir": "sub"})
    code, out, err = run(capsys, "submit", "--from", path, "--project", "vision", "--gpus", "1", "--env", "SEED=1",
                         "--label", "sweep=a", "--", "python", "default.py")
    assert code == 0 and err == "", err
    assert len(opened) == 1  # three jobs, one connection
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.split()[1] == "queued:" for line in lines)
    assert "1 GPU in project vision as alice" in lines[0] and "0.5 GPU in project vision" in lines[1]
    assert "in project nlp as alice" in lines[2]
    admin = GpupoolClient(env.url, "admin-t")
    jobs = [admin.job(line.split()[0]) for line in lines]
    assert [j["name"] for j in jobs] == ["lr-1", "lr-2", "lr-3"]
    assert [j["id"] for j in jobs] == sorted(j["id"] for j in jobs)  # submitted in file order
    assert jobs[0]["command"] == ["python", "train.py", "--lr", "0.1"] and jobs[2]["command"] == ["python", "default.py"]
    assert [j["request"]["gpus"] for j in jobs] == [1, 0, 1] and jobs[1]["request"]["gpu_fraction"] == 0.5
    assert [j["labels"] for j in jobs] == [{"sweep": "a"}, {"sweep": "a"}, {"sweep": "b"}]
    assert jobs[2]["workdir"] == str(tmp_path / "sub") and jobs[0]["workdir"] == str(tmp_path)  # as typed here


def test_json_prints_one_job_per_line(env, capsys, tmp_path):
    path = jobs_file(tmp_path / "jobs.jsonl", {"name": "a"}, {"name": "b"})
    code, out, err = run(capsys, "submit", "--from", path, "-p", "vision", "--json", "--", "true")
    assert code == 0, err
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["a", "b"]


def test_a_bad_line_submits_nothing_and_each_is_named(env, capsys, tmp_path):
    before = job_count(env)
    path = jobs_file(tmp_path / "jobs.jsonl",
                     {"project": "vision", "command": ["true"]},
                     '{"project": "vision", "command": ["true"]',
                     '["true"]',
                     {"command": ["true"]},
                     {"project": "vision"},
                     "null")
    code, out, err = run(capsys, "submit", "--from", path)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "gpupool: error: line 2: not JSON (Expecting ',' delimiter at column 42)",
        'gpupool: error: line 3: a job is a JSON object ({"project": ..., "command": [...]}), not a list',
        'gpupool: error: line 4: no project: give "project" on the line, or --project',
        "gpupool: error: line 5: no command: give \"command\" on the line, or one after '--'",
        'gpupool: error: line 6: a job is a JSON object ({"project": ..., "command": [...]}), not null',
        f"gpupool: error: 5 bad lines in {path}; nothing submitted",
    ]
    assert job_count(env) == before


def test_a_refused_job_is_reported_by_its_line_and_the_others_go_on(env, capsys, tmp_path):
    path = jobs_file(tmp_path / "jobs.jsonl",
                     {"name": "ok-1"},
                     {"name": "lost", "project": "nope"},
                     "# between",
                     {"name": "ok-2"},
                     {"name": "too-much", "gpu_fraction": 1.5},
                     {"name": "ok-3"})
    code, out, err = run(capsys, "submit", "--from", path, "-p", "vision", "--", "true")
    assert code == 1
    admin = GpupoolClient(env.url, "admin-t")
    assert [admin.job(line.split()[0])["name"] for line in out.splitlines()] == ["ok-1", "ok-2", "ok-3"]
    errors = err.splitlines()
    assert errors[0] == "gpupool: error: line 2: unknown project 'nope'"
    assert errors[1].startswith("gpupool: error: line 5: ") and "gpu_fraction" in errors[1]
    assert errors[2:] == ["gpupool: error: 2 of 5 jobs refused (lines 2, 5); the other 3 were submitted"]


def test_an_unreachable_scheduler_stops_at_once_saying_what_was_not_submitted(env, capsys, tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = jobs_file(tmp_path / "jobs.jsonl", {"name": "a"}, {"name": "b"}, {"name": "c"})
    code, out, err = run(capsys, "submit", "--from", path, "-p", "vision", "--url", f"http://127.0.0.1:{port}",
                         "--", "true")
    assert code == 3 and out == ""
    first, stop = err.splitlines()
    assert first.startswith(f"gpupool: error: line 1: cannot reach the scheduler at http://127.0.0.1:{port}")
    assert stop.startswith("gpupool: error: stopped: lines 1-3 not submitted (3 of 3 jobs); 0 submitted before;")


def test_a_bad_token_stops_after_the_first_line(env, capsys, tmp_path):
    path = jobs_file(tmp_path / "jobs.jsonl", {"name": "a"}, {"name": "b"})
    code, out, err = run(capsys, "submit", "--from", path, "-p", "vision", "--token", "wrong", "--", "true")
    assert code == 1 and out == ""
    first, stop = err.splitlines()
    assert first.startswith("gpupool: error: line 1: ") and "invalid token" in first
    assert stop.startswith("gpupool: error: stopped: lines 1-2 not submitted (2 of 2 jobs)")


@pytest.mark.parametrize(("argv", "message"), [
    (["--from", "missing.jsonl", "-p", "vision"], "cannot read --from missing.jsonl: No such file or directory"),
    (["--from", "jobs.jsonl", "-p", "vision", "--client-key", "k", "--", "true"], "same key"),
    (["--from", "jobs.jsonl", "-p", "vision", "--gpus", "0", "--", "true"], "--gpus must be at least 1"),
])
def test_usage_mistakes_with_from_exit_2(env, capsys, tmp_path, argv, message):
    jobs_file(tmp_path / "jobs.jsonl", {"name": "a"})
    code, out, err = run(capsys, "submit", *argv)
    assert code == 2 and out == "" and err.startswith("gpupool: error: ") and message in err, err


def test_a_file_of_comments_only_submits_nothing_and_says_so(env, capsys, tmp_path):
    path = jobs_file(tmp_path / "jobs.jsonl", "# nothing yet", "")
    code, out, err = run(capsys, "submit", "--from", path, "-p", "vision")
    assert code == 0 and out == "" and err == f"gpupool: no jobs in {path} (only blank lines and # comments); " \
                                              "nothing submitted\n"


def test_standard_input_as_a_real_process(svc, tmp_path):
    lines = "".join(json.dumps({"name": f"stdin-{i}", "command": ["true"]}) + "\n" for i in range(5))
    result = subprocess.run([sys.executable, "-m", "gpupool", "submit", "--from", "-", "--project", "vision",
                             "--json"], env=cli_env(svc.url, svc.alice, tmp_path), input=lines,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["name"] for line in result.stdout.splitlines()] == [f"stdin-{i}" for i in range(5)]


def test_a_reader_that_stops_reading_does_not_stop_the_submits(svc, tmp_path):
    """`gpupool submit --from jobs.jsonl | head -1`: every job is still submitted (the lines just go nowhere)."""
    path = jobs_file(tmp_path / "jobs.jsonl", *({"name": f"piped-{i}", "command": ["true"]} for i in range(300)))
    before = job_count(svc)
    process = subprocess.Popen([sys.executable, "-m", "gpupool", "submit", "--from", path, "-p", "vision"],
                               env=cli_env(svc.url, svc.alice, tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().startswith("j-")
    process.stdout.close()  # as head does after its line
    assert process.wait(60) == 0, process.stderr.read() if process.stderr else ""
    assert job_count(svc) == before + 300


def test_a_plain_submit_refused_as_a_real_process_is_one_line_and_exit_1(svc, tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpupool", "submit", "--project", "nope", "--gpus", "1", "--",
                             "true"], env=cli_env(svc.url, svc.alice, tmp_path), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "gpupool: error: unknown project 'nope'\n"


def test_merge_rules():
    defaults = {"project": "p", "gpus": 2, "env": {"A": "1", "B": "1"}, "labels": {"x": "1"}, "command": ["d"]}
    assert merged(defaults, {"gpu_memory": 10}) == {"project": "p", "gpu_memory": 10, "env": {"A": "1", "B": "1"},
                                                    "labels": {"x": "1"}, "command": ["d"]}
    assert merged(defaults, {"env": {"B": "2"}, "command": ["c"], "project": "q"})["env"] == {"A": "1", "B": "2"}
    assert merged(defaults, {"labels": None})["labels"] is None  # not a dict: the line's value, for the server
    assert merged({}, {"workdir": "/abs"})["workdir"] == "/abs"
