"""The scheduler service core: the one object the HTTP API drives.

Contract (see docs/design.md): methods take and return plain dicts in the wire
shapes (Job, Project, Pool), raise :mod:`scheduler.errors` exceptions for bad
input or forbidden actions, and run on the asyncio loop of the process.
Authorization lives here, not in the HTTP layer, so every caller gets it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user name, and whether they hold the admin token."""

    user: str
    admin: bool = False


# The implementation (class SchedulerCore) is built in this module by the
# service work. Its public surface, which scheduler.api relies on:
#
#   SchedulerCore(config: ServiceConfig)           config from scheduler.service.config
#   await core.start() / await core.stop()          recover from the store, run cycles and ticks
#   core.simulated -> bool
#   core.registry -> prometheus_client.CollectorRegistry
#   core.status() -> dict                            {"simulated", "pool", "projects", "queue"}
#   core.pool() -> dict                              Pool
#   core.list_projects() -> list[dict]
#   core.set_project(actor, name, fields: dict) -> dict       admin only
#   core.delete_project(actor, name) -> None                  admin only
#   await core.submit(actor, spec: dict) -> tuple[dict, bool] (Job, created)
#   core.list_jobs(actor, filters: dict) -> list[dict]
#   core.get_job(actor, job_id) -> dict
#   await core.pause(actor, job_id) / resume / cancel -> dict
#   core.renew(actor, job_id) -> dict
#   core.read_log(actor, job_id, offset: int, limit: int | None) -> dict
#   core.events_since(seq: int) -> list[dict]; await core.wait_events(seq, timeout) -> list[dict]
#   core.last_event_seq -> int
#   core.history(since: float | None) -> dict
#   core.tokens: user-token store: core.create_token(actor, user) -> dict; core.authenticate(token) -> Actor | None
