"""The JupyterLab front end is built, installed, and shipped prebuilt in the wheel.

`pip install -e .` builds labextension/ through the hatch-jupyter-builder hook;
these tests check what a user relies on: Jupyter lists the extension as
enabled, and a wheel carries the built extension as data files, so installing
it needs no Node.js.

Nothing here installs into or uninstalls from the running environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "jupyter_gpupool" / "labextension"
SHARE = "share/jupyter/labextensions/jupyter-gpupool"
VENV_BIN = Path(sys.executable).parent


def _no_node_env(**extra: str) -> dict[str, str]:
    """This interpreter's scripts on PATH and nothing else: no node, npm or jlpm reachable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "npm_", "NODE"))}
    env["PATH"] = str(VENV_BIN)
    env.update(extra)
    return env


def _require_built() -> None:
    if not (BUILT / "package.json").exists():
        pytest.fail(
            "jupyter_gpupool/labextension is not built: run `pip install -e .` with Node.js available "
            "(or `cd labextension && jlpm install && jlpm build`)"
        )


def test_built_extension_is_the_package_with_an_entry_point() -> None:
    _require_built()
    meta = json.loads((BUILT / "package.json").read_text())
    source = json.loads((ROOT / "labextension" / "package.json").read_text())
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert meta["name"] == source["name"] == "jupyter-gpupool"
    assert meta["version"] == source["version"] == version.group(1)
    load = meta["jupyterlab"]["_build"]["load"]
    assert (BUILT / load).is_file(), f"the build names {load}, which is missing"
    assert (BUILT / "static" / "style.js").is_file()


def test_jupyter_lists_the_extension_enabled() -> None:
    _require_built()
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        env=_no_node_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # the colours of "enabled" and "OK"
    # The extension's own line starts with its name. Matching "jupyter-gpupool" anywhere also matched the
    # labextensions folder's line above it in a clone named jupyter-gpupool/ (git clone's default).
    line = next((x for x in out.splitlines() if x.split()[:1] == ["jupyter-gpupool"]), "")
    assert re.search(r"\benabled\b.*\bOK\b", line), out
    assert "(python, jupyter-gpupool)" in line, out


def test_wheel_ships_the_prebuilt_extension_and_installs_without_node(tmp_path: Path) -> None:
    _require_built()
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        env=_no_node_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("jupyter_gpupool-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert f"{SHARE}/package.json" in data
    assert f"{SHARE}/install.json" in data
    assert any(n.startswith(f"{SHARE}/static/remoteEntry.") for n in data)
    assert not any("node_modules" in n for n in names)

    # Lay the wheel's data files out in a fresh prefix as an installer does (never `pip install
    # --prefix` here: pip would uninstall the project from the running environment first).
    prefix = tmp_path / "prefix"
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            if ".data/data/" in name and not name.endswith("/"):
                target = prefix / name.split(".data/data/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    installed = prefix / SHARE
    assert json.loads((installed / "package.json").read_text())["name"] == "jupyter-gpupool"
    listing = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        env=_no_node_env(JUPYTER_PATH=str(prefix / "share" / "jupyter")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = (listing.stdout + listing.stderr).splitlines()
    here = str(prefix / "share" / "jupyter" / "labextensions")
    assert here in lines, lines
    following = lines[lines.index(here) + 1]
    assert "jupyter-gpupool" in following and "enabled" in following and "OK" in following, lines


def test_sdist_has_the_sources_and_the_build_but_no_node_installs(tmp_path: Path) -> None:
    _require_built()
    import tarfile

    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=ROOT,
        env=_no_node_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sdist,) = tmp_path.glob("jupyter_gpupool-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    assert "labextension/src/index.ts" in names and "labextension/yarn.lock" in names
    assert "jupyter_gpupool/labextension/package.json" in names
    assert not [n for n in names if "node_modules" in n or "/.yarn/" in n]
