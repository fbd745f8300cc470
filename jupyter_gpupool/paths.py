"""Turning user-given notebook paths into files, never outside the server root.

Promote and the parameter listing read a notebook named by the browser; the
path is untrusted. Everything resolves (symlinks included) under the root, or
is refused with a clear 4xx.
"""

from __future__ import annotations

import os

from gpupool.wire.errors import Forbidden, InvalidRequest, NotFound

MAX_PATH = 4096  # PATH_MAX on Linux: a longer path names no file, and is not echoed back whole


def resolve_notebook(root_dir: str, path: str) -> str:
    """The real file for ``path`` (relative to ``root_dir``, or absolute inside it).

    Raises InvalidRequest for an empty or non-notebook path, Forbidden for one
    that leaves the root (``..``, absolute elsewhere, a symlink out), NotFound
    when no such notebook exists.
    """
    if not isinstance(path, str) or not path.strip():
        raise InvalidRequest("give the notebook's path relative to the server root")
    if "\x00" in path:
        raise InvalidRequest("the notebook path contains a NUL byte")
    if len(path) > MAX_PATH:
        raise InvalidRequest(f"the notebook path is too long: {len(path)} characters, at most {MAX_PATH}")
    root = os.path.realpath(root_dir)
    candidate = path if os.path.isabs(path) else os.path.join(root, path)
    full = inside_root(root, candidate, path, "only notebooks under it can be used")
    if not full.endswith(".ipynb"):
        raise InvalidRequest(f"'{path}' is not a notebook (.ipynb)")
    if not os.path.isfile(full):
        raise NotFound(f"no notebook at '{path}'")
    return full


def inside_root(root_dir: str, candidate: str, shown: str, why: str) -> str:
    """The real path of ``candidate`` (symlinks followed, even dangling ones), or Forbidden if it leaves the root.

    ``shown`` is how the error names the path (the user's own words, never the
    real target, which may be a place the user should not learn about).
    """
    root = os.path.realpath(root_dir)
    full = os.path.realpath(candidate)
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        raise Forbidden(f"'{shown}' is outside the server root; {why}")
    return full


def relative_to_root(root_dir: str, full: str) -> str:
    """An API path ('a/b.ipynb') for a file under the root."""
    return os.path.relpath(os.path.realpath(full), os.path.realpath(root_dir)).replace(os.sep, "/")
