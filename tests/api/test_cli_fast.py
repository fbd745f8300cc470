"""The fast path of `gpupool submit` (gpupool.cli.fast): the same job as the full CLI, or it steps aside.

It reads a plain submit by hand to skip argparse, json and socket at start
(bench/cli.py measures why); whatever it reads must be what argparse reads,
and whatever it cannot read exactly goes to the full CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpupool.cli import fast as cli_fast
from gpupool.cli import main as cli
from gpupool.client import GpupoolClient

from .servers import EmbeddedThread, cli_env


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A real scheduler (embedded, simulated GPUs) with project vision and a token for alice."""
    srv = EmbeddedThread(tmp_path_factory.mktemp("fast") / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}})
    srv.alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
    yield srv
    srv.close()

PLAIN = [
    ["submit", "--project", "vision", "--gpus", "2", "--", "python", "train.py", "--lr", "0.1"],
    ["submit", "-p", "vision", "--gpu-fraction", "0.25", "--name", "tiny", "--", "true"],
    ["--url", "http://h:1", "submit", "--project=vision", "--priority", "-3", "--", "x", "--", "y"],
    ["submit", "--token", "t", "--project", "v", "--workdir", "rel/dir", "--env", "A=1", "--env", "B==2",
     "--label", "nb=x.ipynb", "--", "sh", "-c", "echo hi"],
    ["submit", "--project", "v", "--name", "-1.5", "--", "x"],
]
NOT_PLAIN = [
    ["submit", "--project", "v", "--json", "--", "x"],  # prints JSON: the full CLI's
    ["submit", "--proj", "v", "--", "x"],  # an abbreviation argparse accepts
    ["submit", "--project", "v", "--gpus", "1", "--gpu-fraction", "0.5", "--", "x"],
    ["submit", "--project", "v", "--gpus", "0", "--", "x"],
    ["submit", "--project", "v", "--gpus", "two", "--", "x"],
    ["submit", "--project", "v", "--gpu-fraction", "1.5", "--", "x"],
    ["submit", "--project", "v", "--name", "--gpus", "--", "x"],
    ["submit", "--project", "v", "--env", "noequals", "--", "x"],
    ["submit", "--project", "v", "--project", "w", "--", "x"],
    ["submit", "--project", "v", "--gpu-memory", "20GiB", "--", "x"],
    ["submit", "--project", "v", "--image", "registry.example/x:2", "--", "x"],  # argparse's (cli.py) flag
    ["submit", "--project", "v", "--help", "--", "x"],
    ["submit", "--project", "v", "--"],
    ["submit", "--project", "v", "x"],
    ["list", "--name", "submit", "--", "x"],
    ["submit", "submit", "--project", "v", "--", "x"],
    ["--gpus", "1", "--", "x"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_a_plain_submit_is_read_as_argparse_reads_it(argv):
    spec, url, token = cli_fast.parse_submit(argv)
    options, command = cli._split_command(argv)
    args = cli.build_parser("submit").parse_args(options)
    assert spec == cli.submit_spec(args, command)
    assert (url, token) == (args.url, args.token)


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_anything_else_goes_to_the_full_cli(argv):
    assert cli_fast.parse_submit(argv) is None


def test_the_script_submits_through_the_fast_path_and_imports_little(env, tmp_path):
    """The real entry point: the job is submitted, the line is the full CLI's, argparse and json never load."""
    probe = ("import sys\n"
             "from gpupool.cli import fast as cli_fast\n"
             "sys.argv = ['gpupool', 'submit', '--project', 'vision', '--gpus', '1', '--', 'true']\n"
             "code = cli_fast.main()\n"
             "print(code, sorted(m for m in ('argparse', 'json', 'socket', 're', 'gpupool.cli.main') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe], env=cli_env(env.url, env.alice, tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    line, report = result.stdout.strip().splitlines()
    assert report == "0 []"
    assert line.startswith("j-") and "in project vision as alice" in line
    full = subprocess.run([sys.executable, "-m", "gpupool", "submit", "--project", "vision", "--gpus", "1",
                           "--json", "--", "true"], env=cli_env(env.url, env.alice, tmp_path),
                          capture_output=True, text=True, timeout=60)
    job = json.loads(full.stdout)
    assert cli_fast.submitted_line(job) == line.replace(line.split()[0], job["id"])  # same words, next id


def test_a_refusal_on_the_fast_path_is_the_full_clis_message_and_exit(env, tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpupool", "submit", "--project", "nope", "--gpus", "1", "--",
                          "true"], env=cli_env(env.url, env.alice, tmp_path), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stderr.startswith("gpupool: error: ") and "nope" in out.stderr
