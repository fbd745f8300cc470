"""GET /api/v1/events: the live event stream, as long-poll JSON or Server-Sent Events.

Long-poll (the default) suits the Python client and the Jupyter extension:
``?since=<seq>&timeout=<s>`` returns at once when events newer than ``seq``
exist, else waits up to ``timeout`` seconds for one. ``last`` is the seq to pass
next time; when the core's sequence has moved on (restart, trimmed buffer) it is
the core's latest, so a client never waits on a seq that will not come.

SSE (``Accept: text/event-stream``) suits browsers and ``curl -N``: one
``id:``/``event:``/``data:`` record per event, a comment line as keep-alive,
resuming from ``Last-Event-ID`` after a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from tornado.iostream import StreamClosedError

from gpupool.api.base import ApiHandler, maybe_await
from gpupool.wire.schemas import MAX_SEQ, MAX_WAIT_S

KEEPALIVE_S = 15.0


class EventsHandler(ApiHandler):
    def initialize(self, core: Any) -> None:
        super().initialize(core)
        self._closed = False
        self._gone = asyncio.Event()

    def on_connection_close(self) -> None:
        self._closed = True
        self._gone.set()
        super().on_connection_close()

    async def get(self) -> None:
        if "text/event-stream" in self.request.headers.get("Accept", ""):
            await self._stream()
        else:
            await self._long_poll()

    async def _long_poll(self) -> None:
        since = self.query_int("since", 0, minimum=0, maximum=MAX_SEQ) or 0
        timeout = self.query_float("timeout", 0.0, minimum=0.0, maximum=MAX_WAIT_S)
        events = list(await maybe_await(self.core.events_since(since)))
        if not events and timeout:
            events = list(await self._wait(since, timeout))
        if self._closed:
            return  # the client left; nobody to answer
        last = events[-1]["seq"] if events else int(self.core.last_event_seq)
        self.write_json({"events": events, "last": last})

    async def _wait(self, since: int, timeout: float) -> list[dict[str, Any]]:
        """Wait for events, but give up early when the service shuts down or the client leaves."""
        shutdown: asyncio.Event | None = self.settings.get("shutdown_event")
        waiter = asyncio.ensure_future(maybe_await(self.core.wait_events(since, timeout)))
        stoppers = [asyncio.ensure_future(self._gone.wait())]
        if shutdown is not None:
            stoppers.append(asyncio.ensure_future(shutdown.wait()))
        try:
            await asyncio.wait({waiter, *stoppers}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stopper in stoppers:
                stopper.cancel()
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        return []

    async def _stream(self) -> None:
        last_id = self.request.headers.get("Last-Event-ID")
        if last_id is not None and last_id.strip().isdigit() and int(last_id) <= MAX_SEQ:
            seq = int(last_id)
        else:
            since = self.query_int("since", None, minimum=0, maximum=MAX_SEQ)
            seq = int(self.core.last_event_seq) if since is None else since
        shutdown: asyncio.Event | None = self.settings.get("shutdown_event")
        self.set_header("Content-Type", "text/event-stream; charset=UTF-8")
        self.set_header("X-Accel-Buffering", "no")
        self.set_status(200)
        try:
            self.write(": gpupool events\n\n")
            await self.flush()
            while not self._closed and not (shutdown is not None and shutdown.is_set()):
                seq = min(seq, int(self.core.last_event_seq))  # the sequence restarted: follow it
                events = list(await maybe_await(self.core.events_since(seq)))
                if not events:
                    events = await self._wait(seq, KEEPALIVE_S)
                if events:
                    for event in events:
                        seq = int(event["seq"])
                        self.write(f"id: {seq}\nevent: {event.get('type', 'message')}\n"
                                   f"data: {json.dumps(event, separators=(',', ':'))}\n\n")
                else:
                    self.write(": keep-alive\n\n")
                await self.flush()
            self.finish()
        except StreamClosedError:
            return
