/**
 * Notifications for the user's training jobs (JupyterLab 4 Notification API).
 *
 * Submitting tells the user the job id and where to watch it; afterwards each
 * state change of one of *their* training jobs (start, pause, resume, finish,
 * failure) becomes a notification with links to the job and, once it exists,
 * to the output notebook. Kernel shares (build jobs) are not announced: the
 * status bar shows them.
 *
 * A notification announces a change of state, so each job's state before an
 * event must be known. Events carry a job's state after each change of the job,
 * and not every change is one of state: when a pause begins, the still running
 * job's reason changes first (a `running` event carrying the pause reason), and
 * `paused` follows once its process has stopped. So the user's jobs are read
 * once when the event stream opens: a job that was running before Lab opened
 * is known as running, and that first `running` event announces nothing.
 *
 * Idle GPUs (the scheduler's `idle` events, for the user's own kernels and
 * jobs): a kernel whose share its project counts idle is warned that its
 * Jupyter server will shut it down after a notice (the warning stays until the
 * kernel is busy again or shut down); the shutdown itself is announced when its
 * share ends; a training job flagged idle is announced (one paused on idle is
 * announced by its pause, whose reason says so).
 */
import { Notification } from '@jupyterlab/apputils';

import { api, describeError, GpupoolError, IGpupoolEvent, IJob, JobState } from './api';
import { EventStream } from './events';
import { basename, formatRequest } from './format';

/** What the notifier needs from the rest of the extension. */
export interface INotifierHost {
  /** The current user's name (from /status), or null before it is known. */
  me(): string | null;
  /** Reveal the GPU Pool panel on this job's detail. */
  showJob(id: string): void;
  /** Open a notebook or file (path relative to the server root). */
  openPath(path: string): void;
}

interface ITracked {
  state: JobState;
  kind: string;
  name: string;
  output: string | null;
  /** Paused since it last ran: its next start is a resume (it may requeue in between). */
  wasPaused: boolean;
}

const AUTO_CLOSE_MS = 8000;

/** The scheduler's `idle` event: a running job's share is idle by use (idle_since set) or no longer (null). */
interface IIdleEvent extends IGpupoolEvent {
  name?: string;
  kind?: string;
  idle_since?: string | null;
  action?: 'cull' | 'flag' | 'pause' | null;
}

/** A kernel of the user's that the scheduler flagged for culling, and its standing warning. */
interface IIdleKernel {
  name: string;
  since: string;
  notification: string;
}

export class JobNotifier {
  private _jobs = new Map<string, ITracked>();
  private _idleKernels = new Map<string, IIdleKernel>();
  /** The read of the user's jobs when the stream opened; events wait for it. */
  private _seeded: Promise<void> = Promise.resolve();
  /** Event batches are handled one after the other, in the order they came. */
  private _handled: Promise<void> = Promise.resolve();

  constructor(
    private _host: INotifierHost,
    stream: EventStream
  ) {
    stream.opened.connect(() => {
      this._seeded = this._seed();
    });
    stream.received.connect((_, events) => {
      this._handled = this._handled
        .then(() => this._seeded)
        .then(() => this.handle(events))
        .catch(err => console.warn('gpupool: job notifications:', err));
    });
    stream.reachableChanged.connect((sender, reachable) => {
      if (!reachable) {
        Notification.warning(sender.error || 'The GPU scheduler is unreachable.', {
          autoClose: AUTO_CLOSE_MS
        });
      } else {
        Notification.info('The GPU scheduler is reachable again.', { autoClose: 4000 });
      }
    });
  }

  /** Announce a promoted job and start following it. */
  submitted(job: IJob, path: string): void {
    this._remember(job);
    const where = job.state === 'running' ? 'is running' : `is ${job.state}`;
    Notification.success(
      `Promoted ${basename(path)}: job ${job.id} (${job.project}, ${formatRequest(job.request)}) ${where}.`,
      { autoClose: AUTO_CLOSE_MS, actions: [this._showAction(job.id)] }
    );
  }

  /** Turn job events into notifications (only the user's own training jobs). */
  async handle(events: IGpupoolEvent[]): Promise<void> {
    const me = this._host.me();
    for (const event of events) {
      if (event.type === 'idle') {
        if (me !== null && event.user === me && event.job_id) {
          this._idle(event as IIdleEvent);
        }
        continue;
      }
      if (event.type !== 'job' || !event.job_id || !event.state) {
        continue;
      }
      const culled = this._idleKernels.get(event.job_id);
      if (culled && isFinal(event.state)) {
        this._idleKernels.delete(event.job_id);
        Notification.dismiss(culled.notification);
        Notification.warning(
          `${kernelLabel(culled.name)} was shut down: its GPU share had been idle since ${clock(culled.since)}, ` +
            'and is back in the pool. Restart the kernel to get a GPU share again.',
          { autoClose: false }
        );
      }
      const known = this._jobs.get(event.job_id);
      if (!known && (me === null || event.user !== me)) {
        continue;
      }
      let tracked = known;
      if (!tracked || (isFinal(event.state) && !tracked.output)) {
        tracked = await this._lookup(event.job_id, tracked);
        if (!tracked) {
          continue;
        }
      }
      const previous = tracked.state;
      const resumed = tracked.wasPaused && event.state === 'running';
      tracked.state = event.state;
      if (event.state === 'paused') {
        tracked.wasPaused = true;
      } else if (event.state === 'running') {
        tracked.wasPaused = false;
      }
      if (tracked.kind !== 'train' || previous === event.state) {
        continue;
      }
      this._announce(event, tracked, resumed);
    }
  }

  /** Announce a change of an own job's idle flag (see the module's note). */
  private _idle(event: IIdleEvent): void {
    const id = event.job_id as string;
    const name = event.name || id;
    const warned = this._idleKernels.get(id);
    if (!event.idle_since) {
      if (warned) {
        this._idleKernels.delete(id);
        Notification.dismiss(warned.notification);
        Notification.info(`${kernelLabel(warned.name)} is using its GPU again: it is not shut down.`, {
          autoClose: AUTO_CLOSE_MS
        });
      }
      return;
    }
    const since = clock(event.idle_since);
    if (warned && event.action !== 'cull') {
      // The admin's rule no longer culls it: the standing warning no longer applies.
      this._idleKernels.delete(id);
      Notification.dismiss(warned.notification);
    }
    if (event.kind === 'build' && event.action === 'cull') {
      if (warned) {
        return;
      }
      const notification = Notification.warning(
        `${kernelLabel(name)}: its GPU share has been idle since ${since}. Its Jupyter server will shut the ` +
          'kernel down shortly to give the share back to the pool, unless it uses its GPU again or a cell is running.',
        { autoClose: false, actions: [this._showAction(id)] }
      );
      this._idleKernels.set(id, { name, since: event.idle_since, notification });
    } else if (event.action === 'flag') {
      const what = event.kind === 'build' ? kernelLabel(name) : `Job ${id} (${name})`;
      Notification.info(`${what}: its GPU share has been idle since ${since} (under its project's idle threshold).`, {
        autoClose: AUTO_CLOSE_MS,
        actions: [this._showAction(id)]
      });
    }
  }

  /** Learn the states of the user's jobs as they are when the stream opens (see the module's note). */
  private async _seed(): Promise<void> {
    let jobs: IJob[];
    try {
      jobs = await api.jobs(true);
    } catch {
      return; // unreachable: the jobs are learned from their events instead
    }
    for (const job of jobs) {
      if (!this._jobs.has(job.id)) {
        this._remember(job);
      }
    }
  }

  /** Follow ``job`` from the state it has now. */
  private _remember(job: IJob): void {
    this._jobs.set(job.id, {
      state: job.state,
      kind: job.kind,
      name: job.name,
      output: job.output_notebook ?? null,
      wasPaused: job.state === 'paused'
    });
  }

  private async _lookup(id: string, known?: ITracked): Promise<ITracked | undefined> {
    try {
      const job = await api.job(id);
      const tracked: ITracked = {
        // Not among the jobs read when the stream opened: submitted since, so it was queued.
        state: known?.state ?? 'queued',
        kind: job.kind,
        name: job.name,
        output: job.output_notebook ?? known?.output ?? null,
        wasPaused: known?.wasPaused ?? job.state === 'paused'
      };
      this._jobs.set(id, tracked);
      return tracked;
    } catch (err) {
      if (err instanceof GpupoolError && err.status === 404) {
        return undefined;
      }
      return known;
    }
  }

  private _announce(event: IGpupoolEvent, job: ITracked, resumed: boolean): void {
    const id = event.job_id as string;
    const label = `Job ${id} (${job.name})`;
    const reason = event.reason ? `: ${event.reason}` : '';
    const actions: Notification.IAction[] = [this._showAction(id)];
    if (job.output && event.state !== 'queued') {
      actions.push(this._outputAction(job.output));
    }
    switch (event.state) {
      case 'running':
        Notification.info(resumed ? `${label} resumed.` : `${label} started.`, {
          autoClose: AUTO_CLOSE_MS,
          actions
        });
        break;
      case 'paused':
        Notification.warning(`${label} was paused${reason}`, { autoClose: AUTO_CLOSE_MS, actions });
        break;
      case 'succeeded':
        Notification.success(`${label} finished.`, { autoClose: false, actions });
        break;
      case 'failed':
        Notification.error(`${label} failed${reason}`, { autoClose: false, actions });
        break;
      case 'cancelled':
        Notification.info(`${label} was cancelled.`, { autoClose: AUTO_CLOSE_MS, actions });
        break;
      case 'rejected':
        Notification.error(`${label} was rejected${reason}`, { autoClose: false, actions });
        break;
      default:
        break;
    }
  }

  private _showAction(id: string): Notification.IAction {
    return {
      label: 'Show job',
      caption: `Show job ${id} in the GPU Pool panel`,
      displayType: 'link',
      callback: () => this._host.showJob(id)
    };
  }

  private _outputAction(path: string): Notification.IAction {
    return {
      label: 'Open output notebook',
      caption: `Open ${path}`,
      displayType: 'link',
      callback: () => this._host.openPath(path)
    };
  }
}

/** "Kernel nb.ipynb" from a kernel share's job name ("kernel nb.ipynb"). */
function kernelLabel(name: string): string {
  return name.startsWith('kernel ') ? `Kernel ${name.slice(7)}` : `Kernel ${name}`;
}

/** A time of the scheduler's (ISO 8601) as the user's clock shows it. */
function clock(iso: string): string {
  const t = new Date(iso);
  return isNaN(t.getTime()) ? iso : t.toLocaleTimeString();
}

function isFinal(state: JobState): boolean {
  return state === 'succeeded' || state === 'failed' || state === 'cancelled' || state === 'rejected';
}

/** Show an API failure as a notification whose wording says what went wrong. */
export function notifyError(prefix: string, err: unknown): void {
  const message = `${prefix}: ${describeError(err)}`;
  if (err instanceof GpupoolError && err.quota) {
    Notification.warning(message, { autoClose: false });
  } else {
    Notification.error(message, { autoClose: false });
  }
}
