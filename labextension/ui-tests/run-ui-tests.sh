#!/usr/bin/env bash
# Browser tests of the JupyterLab front end: Galata/Playwright in Debian's Chromium
# against a real JupyterLab with the gpupool server extension (simulated GPUs).
#
# Needs the project installed in .venv (scripts/test does that first). Installs the
# `chromium` package when /usr/bin/chromium is missing and we are root; Playwright
# never downloads a browser. Extra arguments go to `playwright test`.
# tests/hub.spec.ts starts a real JupyterHub of its own (hub_server.py, with tests/hub's
# helpers and the configurable-http-proxy scripts/test installs into .venv/chp);
# GPUPOOL_SKIP_HUB=1 skips it, as it does tests/hub.
set -euo pipefail
cd "$(dirname "$0")"
VENV="$(cd ../.. && pwd)/.venv"
export PATH="$VENV/bin:$PATH"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

CHROMIUM="${CHROMIUM_PATH:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "ui-tests: installing Debian's chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "ui-tests: $CHROMIUM is missing and cannot be installed here (run 'apt-get install chromium' as root)" >&2
    exit 1
  fi
fi

if ! jupyter labextension list 2>&1 | grep -q "jupyter-gpupool.*enabled.*OK"; then
  echo "ui-tests: the jupyter-gpupool labextension is not installed in $VENV" >&2
  jupyter labextension list >&2 || true
  exit 1
fi

INSTALL_LOG="$(mktemp)"
if ! jlpm install --immutable >"$INSTALL_LOG" 2>&1; then
  cat "$INSTALL_LOG" >&2
  echo "ui-tests: jlpm install failed" >&2
  exit 1
fi
rm -f "$INSTALL_LOG"

# Notebooks, scheduler state, settings and runtime files of the test server live here.
ROOT_DIR="$(mktemp -d "${TMPDIR:-/tmp}/gpupool-ui-XXXXXX")"
trap 'rm -rf "$ROOT_DIR"' EXIT
export JUPYTERLAB_GALATA_ROOT_DIR="$ROOT_DIR"
# The test Lab's scheduler publishes its runtime file here, not in the user's own
# ~/.local/share/gpupool/runtime (where `gpupool status` would answer from it).
export GPUPOOL_RUNTIME_DIR="$ROOT_DIR/.gpupool-runtime"
# Jupyter's own per-user files likewise: kernels' connection files (runtime), the GPU kernelspecs the
# extension writes (data) and deleted notebooks (the XDG trash under $XDG_DATA_HOME), not ~/.local.
export JUPYTER_RUNTIME_DIR="$ROOT_DIR/.runtime"
export XDG_DATA_HOME="$ROOT_DIR/.local/share"
# A free port for the test server, unless one is given.
export GPUPOOL_UI_PORT="${GPUPOOL_UI_PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

# The tests write only to temporary or ignored paths (screenshots go to
# ui-tests/screenshots/ or $GPUPOOL_SCREENSHOTS_DIR; scripts/screenshots refreshes
# docs/screenshots/). Check that: the tracked files the browser run reads or could
# write (docs, the front end, the examples and the demo pool) are as they were.
# Python sources are left out, so a colleague's edit during the run is no failure.
REPO="$(cd ../.. && pwd)"
WATCHED=(docs labextension examples binder)
tracked_changes() {
  git -C "$REPO" ls-files --modified --deleted -- "${WATCHED[@]}" | sort -u | while IFS= read -r f; do
    if [ -e "$REPO/$f" ]; then
      echo "$f $(git -C "$REPO" hash-object -- "$f")"
    else
      echo "$f deleted"
    fi
  done
}
CHECK_TREE=""
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  CHECK_TREE=1
  BEFORE="$(tracked_changes)"
fi

STATUS=0
jlpm playwright test "$@" || STATUS=$?

if [ -n "$CHECK_TREE" ]; then
  CHANGED="$(comm -13 <(echo "$BEFORE" | sort) <(tracked_changes | sort) | cut -d' ' -f1)"
  if [ -n "$CHANGED" ]; then
    echo "ui-tests: the browser tests changed tracked files (they must write to temporary or ignored paths):" >&2
    echo "$CHANGED" | sed 's/^/  /' >&2
    [ "$STATUS" -ne 0 ] || STATUS=1
  fi
fi
exit "$STATUS"
