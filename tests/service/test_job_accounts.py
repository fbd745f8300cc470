"""A root scheduler runs each job as its owner's Unix account, and no job reaches a secret (issue 16, item 5).

Real accounts, made here with ``useradd`` (CI runs as root); skipped, with the
reason, where the tests cannot make accounts. A job of alice tries what the
issue's attacker did: read the admin token, the database and the state
directory, bob's log and files, the service's environment. Every attempt
must fail, and the job must run as alice's uid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.app.backend import build_core
from gpupool.service.config import ServiceConfig
from gpupool.service.core import Actor
from gpupool.wire.errors import Forbidden, InvalidRequest
from tests.service.helpers import ADMIN, fast_config, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="making Unix accounts for the jobs needs root and useradd")

ALICE, BOB = "gpt-alice", "gpt-bob"


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    made = []
    for name in (ALICE, BOB):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
            made.append(name)
    yield {name: pwd.getpwnam(name) for name in (ALICE, BOB)}
    for name in made:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory jobs of other accounts can pass through (/tmp/x, not pytest's 0700 tmp_path)."""
    base = Path(tempfile.mkdtemp(prefix="gpupool-accounts-"))
    os.chmod(base, 0o755)
    yield base / "state"
    shutil.rmtree(base, ignore_errors=True)


ATTACK = r"""
echo "uid=$(id -u)"
try() { if eval "$2" >/dev/null 2>&1; then echo "$1: READ"; else echo "$1: denied"; fi; }
try token "cat $STATE/admin_token"
try db "cat $STATE/state.db"
try list "ls $STATE"
try jobs "ls $STATE/jobs"
try bob-log "cat $STATE/jobs/$BOBJOB/job.log"
try bob-files "cat $STATE/jobs/$BOBJOB/work/secret.txt"
try bob-run "ls $STATE/jobs/$BOBJOB/run"
try service-env "cat /proc/$SERVICE/environ"
env | grep -c GPUPOOL_ADMIN_TOKEN || true
echo mine > own.txt && cat own.txt
"""


async def test_jobs_run_as_their_owners_and_reach_no_secret(accounts, state_dir, monkeypatch):
    monkeypatch.setenv("GPUPOOL_ADMIN_TOKEN", "leaked-if-you-see-this")
    core = build_core(fast_config(state_dir, run_jobs_as="owner"))
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 2})
        bob, _ = await core.submit(Actor(BOB), {"project": "p", "gpus": 1, "command": [
            "sh", "-c", "echo bob-secret > secret.txt; echo bob-log-line; sleep 30"]})
        await wait_for(lambda: core.get_job(ADMIN, bob["id"])["state"] == "running", what="bob's job")
        await wait_for(lambda: "bob-log-line" in core.read_log(Actor(BOB), bob["id"])["data"], what="bob's log")
        env = {"STATE": str(state_dir), "BOBJOB": bob["id"], "SERVICE": str(os.getpid())}
        alice, _ = await core.submit(Actor(ALICE), {"project": "p", "gpus": 1, "env": env,
                                                    "command": ["sh", "-c", ATTACK]})
        await wait_for(lambda: core.get_job(ADMIN, alice["id"])["state"] in ("succeeded", "failed"),
                       what="alice's job")
        out = core.read_log(Actor(ALICE), alice["id"])["data"]
        assert core.get_job(ADMIN, alice["id"])["state"] == "succeeded", out
        assert f"uid={accounts[ALICE].pw_uid}" in out
        for what in ("token", "db", "list", "jobs", "bob-log", "bob-files", "bob-run", "service-env"):
            assert f"{what}: denied" in out, out
        assert "leaked" not in out and "\n0\n" in out  # no admin token in the job's environment
        assert out.rstrip().endswith("mine")  # its own working directory is its own
        work = Path(core.get_job(ADMIN, alice["id"])["workdir"])
        assert (work.stat().st_uid, oct(work.stat().st_mode & 0o777)) == (accounts[ALICE].pw_uid, "0o700")
        log = state_dir / "jobs" / alice["id"] / "job.log"
        assert (log.stat().st_uid, oct(log.stat().st_mode & 0o777)) == (accounts[ALICE].pw_uid, "0o600")
        assert oct((state_dir / "state.db").stat().st_mode & 0o777) == "0o600"
        await core.cancel(Actor(BOB), bob["id"])
    finally:
        await core.stop()


async def test_jobs_of_users_without_an_account_or_of_root_are_refused(accounts, state_dir):
    core = build_core(fast_config(state_dir, run_jobs_as="owner"))
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 1, "build_quota": 1})
        spec = {"project": "p", "gpus": 1, "command": ["true"]}
        with pytest.raises(Forbidden, match="no Unix account"):
            await core.submit(Actor("no-such-account-x"), spec)
        with pytest.raises(Forbidden, match="does not run jobs as root"):
            await core.submit(Actor("root"), spec)
        # a build share runs no process: any user may hold one
        share, _ = await core.submit(Actor("no-such-account-x"), {"project": "p", "kind": "build",
                                                                  "gpu_fraction": 0.5})
        assert share["state"] == "running"
        # a working directory the owner may not enter: refused at submit, saying whose account and where
        closed = state_dir.parent / "closed"
        (closed / "inside").mkdir(parents=True)
        os.chmod(closed, 0o700)
        with pytest.raises(InvalidRequest, match=f"workdir {closed}/inside: the job's account '{ALICE}' cannot "
                                                 f"enter and read {closed}$"):
            await core.submit(Actor(ALICE), {**spec, "workdir": str(closed / "inside")})
        # submitted from such a folder (the CLI sends it): the message names --workdir (issue 22, item 11)
        with pytest.raises(InvalidRequest, match="the folder you submitted from.*cannot enter and read /root; "
                                                 "give --workdir"):
            await core.submit(Actor(ALICE), {**spec, "submit_dir": "/root"})
        # a folder it may use runs the job there
        mine = state_dir.parent / "alice-here"
        mine.mkdir()
        os.chown(mine, accounts[ALICE].pw_uid, accounts[ALICE].pw_gid)
        os.chmod(mine, 0o700)
        job, _ = await core.submit(Actor(ALICE), {**spec, "submit_dir": str(mine), "command": ["sh", "-c", "pwd"]})
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="alice's job")
        assert core.read_log(Actor(ALICE), job["id"])["data"].splitlines()[-1] == str(mine)
    finally:
        await core.stop()


async def test_an_account_template_maps_hub_users_to_their_accounts(accounts, state_dir):
    """TLJH's way: Hub user 'alice' has the account 'jupyter-alice'; here 'gpt-{user}' maps 'alice' to gpt-alice."""
    core = build_core(fast_config(state_dir, run_jobs_as="owner", job_account_template="gpt-{user}"))
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 1})
        job, _ = await core.submit(Actor("alice"), {"project": "p", "gpus": 1, "command": ["sh", "-c", "id -u"]})
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="alice's job")
        assert core.read_log(Actor("alice"), job["id"])["data"].splitlines()[-1] == str(accounts[ALICE].pw_uid)
        with pytest.raises(Forbidden, match="no Unix account 'gpt-carol'"):
            await core.submit(Actor("carol"), {"project": "p", "gpus": 1, "command": ["true"]})
    finally:
        await core.stop()
    for bad in ("jupyter-", "{user}-{user}", "{uid}{user}", "x}{user}"):
        with pytest.raises(InvalidRequest, match="job_account_template"):
            ServiceConfig(state_dir=state_dir, job_account_template=bad)


def test_a_state_dir_other_accounts_cannot_enter_is_refused_at_start(accounts, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(InvalidRequest, match="others may not enter it"):
        build_core(ServiceConfig(state_dir=closed / "state", simulate="1xA100-80GB", run_jobs_as="owner"))


PWN_SO = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void seen(void) {
    FILE *f = fopen(SEEN, "a");
    if (f) { fprintf(f, "LD_PRELOAD euid=%d\n", (int)geteuid()); fclose(f); }
}
"""


def _pwn_dir(base: Path) -> Path:
    """What the issue's attacker plants in their home: code that notes the euid of whoever runs it."""
    pwn = base / "pwn"
    pwn.mkdir()
    seen = pwn / "seen"
    seen.touch()
    note = f"import os\nopen({str(seen)!r}, 'a').write('%s euid=%d\\n' % (__name__, os.geteuid()))\n"
    (pwn / "sitecustomize.py").write_text(note)
    (pwn / "startup.py").write_text(note)
    for tool in ("true", "sh", "python", "python3"):
        (pwn / tool).write_text(f"#!/bin/sh\necho \"PATH euid=$(id -u)\" >> {seen}\n")
    if shutil.which("cc"):
        (pwn / "pwn.c").write_text(PWN_SO.replace("SEEN", f'"{seen}"'))
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(pwn / "libpwn.so"), str(pwn / "pwn.c")], check=True)
    for p in [pwn, *pwn.iterdir()]:
        os.chmod(p, 0o777)
    return pwn


@pytest.mark.parametrize("variable", ["PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH", "PATH"])
async def test_nothing_of_a_jobs_environment_is_run_with_the_services_privileges(accounts, state_dir, variable):
    """Issue 22 item 1: a job's variables reach its own command only, after the drop to its owner's account.

    Each variable points at the attacker's code (which notes the euid that
    ran it); the root wrapper must never run it, and its own environment
    (read from /proc while the job runs) must hold none of the job's names.
    """
    pwn = _pwn_dir(state_dir.parent)
    value = {"PYTHONPATH": str(pwn), "PYTHONSTARTUP": str(pwn / "startup.py"), "LD_LIBRARY_PATH": str(pwn),
             "LD_PRELOAD": str(pwn / "libpwn.so"), "PATH": f"{pwn}:/usr/bin:/bin"}[variable]
    if variable == "LD_PRELOAD" and not (pwn / "libpwn.so").exists():
        pytest.skip("no C compiler to build the preloaded library")
    core = build_core(fast_config(state_dir, run_jobs_as="owner"))
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 1})
        job, _ = await core.submit(Actor(ALICE), {"project": "p", "gpus": 1, "env": {variable: value},
                                                  "command": ["/bin/sh", "-c", "sleep 1; exec env true"]})
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running" and
                       core.book.job(job["id"]).pid, what="alice's job")
        wrapper = core.book.job(job["id"]).pid
        with open(f"/proc/{wrapper}/environ", "rb") as f:
            names = {e.split(b"=", 1)[0].decode() for e in f.read().split(b"\0") if e}
        assert variable not in names or variable == "PATH"
        assert set(names) <= {"PATH", "LANG", "LD_LIBRARY_PATH"}, names  # fixed, the service's own
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] in ("succeeded", "failed"), what="the end")
        seen = (pwn / "seen").read_text()
        assert "euid=0" not in seen, seen
        if variable in ("PATH", "LD_PRELOAD"):  # the job's command did get it, as alice
            assert f"euid={accounts[ALICE].pw_uid}" in seen, seen
    finally:
        await core.stop()


async def test_jobs_never_run_as_system_accounts_unless_the_admin_names_them(accounts, state_dir):
    """Issue 22 item 4: a token for daemon, bin, www-data or nobody runs nothing, unless allowed by name."""
    present = [n for n in ("daemon", "bin", "www-data", "nobody") if _has_account(n)]
    if not present:
        pytest.skip("no system account on this machine")
    spec = {"project": "p", "gpus": 1, "command": ["sh", "-c", "id -u"]}
    core = build_core(fast_config(state_dir, run_jobs_as="owner"))
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 1})
        for name in present:
            with pytest.raises(Forbidden, match=f"system account '{name}'.*allowed_system_accounts"):
                await core.submit(Actor(name), spec)
        job, _ = await core.submit(Actor(ALICE), spec)  # a person's account still runs
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="alice's job")
    finally:
        await core.stop()
    allowed = present[0]
    core = build_core(fast_config(state_dir, run_jobs_as="owner", allowed_system_accounts=[allowed]))
    await core.start()
    try:
        job, _ = await core.submit(Actor(allowed), spec)
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what=f"{allowed}'s job")
        assert core.read_log(Actor(allowed), job["id"])["data"].splitlines()[-1] == str(pwd.getpwnam(allowed).pw_uid)
    finally:
        await core.stop()


def _has_account(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
