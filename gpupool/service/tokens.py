"""Tokens: the admin token (config or generated file) and hashed user tokens.

User tokens are stored as SHA-256 hashes only, so a copy of the database does
not hand out access; comparisons use :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from gpupool.service.store import Store


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def load_or_create_admin_token(state_dir: Path, configured: str | None) -> str:
    """The configured admin token, else the one in ``<state_dir>/admin_token`` (made with mode 0600 at first start)."""
    if configured:
        return configured
    path = Path(state_dir) / "admin_token"
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    token = "gpa_" + secrets.token_urlsafe(32)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.chmod(path, 0o600)
    return token


class TokenStore:
    """Checks tokens; creates user tokens. Who may create them is the core's business."""

    def __init__(self, store: Store, admin_token: str, admin_user: str) -> None:
        self._store = store
        self.admin_token = admin_token
        self.admin_user = admin_user

    def create(self, user: str) -> str:
        token = "gpu_" + secrets.token_urlsafe(32)
        self._store.add_token(hash_token(token), user)
        return token

    def lookup(self, token: object) -> tuple[str, bool] | None:
        """``(user, is_admin)`` for a valid token, else None."""
        if not isinstance(token, str) or not token or len(token) > 512:
            return None
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self.admin_token.encode()):
            return (self.admin_user, True)
        digest = hash_token(token)
        row = self._store.token_user(digest)
        if row is not None and hmac.compare_digest(row[0], digest):
            return (row[1], False)
        return None
