/**
 * One long-poll on `/gpupool/api/events` for the whole front end.
 *
 * The panel, the notifications and the status bar all want to know when
 * something changed; one loop shares a single open request between them and
 * backs off while the scheduler is unreachable instead of hammering it.
 */
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { api, describeError, IGpupoolEvent } from './api';

/** How long the server may hold a poll open (it caps this at 30 s). */
const POLL_TIMEOUT_S = 25;
const MIN_BACKOFF_MS = 2000;
const MAX_BACKOFF_MS = 30000;

export class EventStream implements IDisposable {
  private _since: number | null = null;
  private _abort = new AbortController();
  private _disposed = false;
  private _reachable = true;
  private _error = '';
  private _received = new Signal<this, IGpupoolEvent[]>(this);
  private _reachableChanged = new Signal<this, boolean>(this);
  private _opened = new Signal<this, void>(this);
  private _running = false;

  /** Events as they arrive, in sequence order (never the backlog before start). */
  get received(): ISignal<this, IGpupoolEvent[]> {
    return this._received;
  }

  /**
   * Fires when the stream has learned where the scheduler's events are now, before
   * any event after that point is emitted: what was true then is the starting state
   * (the notifications read the user's jobs there, see notifications.ts).
   */
  get opened(): ISignal<this, void> {
    return this._opened;
  }

  /** Fires when the events endpoint starts or stops answering. */
  get reachableChanged(): ISignal<this, boolean> {
    return this._reachableChanged;
  }

  get reachable(): boolean {
    return this._reachable;
  }

  /** The last error sentence while unreachable, '' otherwise. */
  get error(): string {
    return this._error;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Start polling (idempotent). */
  start(): void {
    if (this._running || this._disposed) {
      return;
    }
    this._running = true;
    void this._loop();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._abort.abort();
    Signal.clearData(this);
  }

  private async _loop(): Promise<void> {
    let backoff = MIN_BACKOFF_MS;
    while (!this._disposed) {
      try {
        if (this._since === null) {
          // Learn where the stream is now; what happened before we opened is history.
          // Asking past the end returns no events and the newest sequence number
          // (asking from 0 would return the oldest page of the backlog instead).
          const head = await api.events(Number.MAX_SAFE_INTEGER, 0, this._abort.signal);
          this._since = head.last;
          this._opened.emit(undefined);
        } else {
          const reply = await api.events(this._since, POLL_TIMEOUT_S, this._abort.signal);
          // `last` is the newest event returned (a page holds at most 1000), or the
          // stream's head when none came; a smaller head means a fresh scheduler state.
          this._since = reply.last;
          const events = reply.events.filter(e => typeof e.seq === 'number');
          if (events.length > 0 && !this._disposed) {
            this._received.emit(events);
          }
        }
        this._setReachable(true, '');
        backoff = MIN_BACKOFF_MS;
      } catch (err) {
        if (this._disposed) {
          return;
        }
        this._setReachable(false, describeError(err));
        await sleep(backoff);
        backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
      }
    }
  }

  private _setReachable(value: boolean, error: string): void {
    this._error = error;
    if (value !== this._reachable) {
      this._reachable = value;
      this._reachableChanged.emit(value);
    }
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms));
}
