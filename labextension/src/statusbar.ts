/**
 * Status bar item: the GPU share of the current kernel and how busy it kept it lately.
 *
 * "GPU ¼ · 37 % busy": the share, then the part of it the kernel's processes
 * kept busy over the last minute (the scheduler's `recent_use`, a mean of its
 * samples; see docs/jupyter.md). "no use data" when nothing could be measured
 * (a GPU without per-process accounting) or no sample came yet: unknown is
 * never shown as 0 % (idle). GPU memory is in the tooltip.
 *
 * The current widget's kernel id is matched against GET /gpupool/api/kernels
 * (the user's GPU kernels with their build jobs). A kernel without a GPU
 * share hides the item, so CPU-only work shows nothing extra.
 *
 * A GPU kernel that is still starting has no id Lab knows (Jupyter answers
 * the session's start only once the kernel runs), so while the notebook has
 * no kernel it is matched by the notebook's path: "GPU ¼ · waiting for a
 * share" (queued behind other work) or "GPU ¼ · starting its pod" (on
 * Kubernetes), the reason and the time it gives up in the tooltip.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { api, IKernelShare } from './api';
import { EventStream } from './events';
import { formatBytes, formatClock, formatGpus, jobMemoryLimit, jobShare } from './format';
import { describeUse } from './usefigures';

const REFRESH_MS = 5000;

export class KernelShareStatus extends Widget {
  private _session: ISessionContext | null = null;
  private _share: IKernelShare | null = null;
  private _activeChanged = new Signal<this, void>(this);
  private _timer = 0;

  constructor(
    stream: EventStream,
    private _onOpen: () => void
  ) {
    super({ node: document.createElement('button') });
    this.addClass('jp-gpupool-status');
    this.node.setAttribute('type', 'button');
    this.node.addEventListener('click', () => this._onOpen());
    stream.received.connect(() => void this.update_());
    this._timer = window.setInterval(() => void this.update_(), REFRESH_MS);
  }

  /** Fires when the item should be shown or hidden (status bar `isActive`). */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  /** True when the current kernel holds (or waits for) a GPU share. */
  get active(): boolean {
    return this._share !== null;
  }

  /** The share shown now (for tests and the panel). */
  get share(): IKernelShare | null {
    return this._share;
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._watch(null);
    super.dispose();
  }

  /** Follow the session of the current widget (null for none). */
  setSession(session: ISessionContext | null): void {
    this._watch(session);
    void this.update_();
  }

  private _watch(session: ISessionContext | null): void {
    if (this._session === session) {
      return;
    }
    if (this._session) {
      this._session.kernelChanged.disconnect(this._onKernel, this);
      this._session.statusChanged.disconnect(this._onKernel, this);
    }
    this._session = session;
    if (session) {
      session.kernelChanged.connect(this._onKernel, this);
      session.statusChanged.connect(this._onKernel, this);
    }
  }

  private _onKernel(): void {
    void this.update_();
  }

  /** Re-read the kernels endpoint and redraw (named so it does not shadow Widget.update). */
  async update_(): Promise<void> {
    const kernelId = this._session?.session?.kernel?.id ?? null;
    const path = this._session?.path ?? '';
    const starting = !kernelId && this._session !== null && !this._session.isDisposed && path !== '';
    let share: IKernelShare | null = null;
    if (kernelId || starting) {
      try {
        const shares = await api.kernels();
        share = kernelId
          ? (shares.find(s => s.kernel_id === kernelId && !s.starting) ?? null)
          : (shares.find(s => s.starting && s.path === path) ?? null);
      } catch {
        share = this._share && this._share.kernel_id === kernelId ? this._share : null;
      }
    }
    if (this.isDisposed || (this._session?.session?.kernel?.id ?? null) !== kernelId) {
      return;
    }
    const wasActive = this.active;
    this._share = share;
    this._render();
    if (wasActive !== this.active) {
      this._activeChanged.emit();
    }
  }

  private _render(): void {
    const share = this._share;
    if (!share) {
      this.node.textContent = '';
      this.node.title = '';
      this.node.removeAttribute('aria-label');
      return;
    }
    const job = share.job;
    if (share.starting || !job) {
      this._renderStarting(share);
      return;
    }
    const gpus = formatGpus(jobShare(job));
    const limit = jobMemoryLimit(job);
    const used = share.gpu_memory_used;
    const memory =
      typeof used === 'number'
        ? `${formatBytes(used)} / ${formatBytes(limit)}`
        : limit !== null
          ? `${formatBytes(limit)} limit`
          : '';
    const waiting = job.state === 'queued' ? ' (waiting)' : job.state !== 'running' ? ` (${job.state})` : '';
    const use = job.state === 'running' ? describeUse(job) : null;
    const idle = job.state === 'running' && job.idle_since ? ' · idle' : '';
    const text = `GPU ${gpus}${use ? ' · ' + use.short : ''}${idle}${waiting}`;
    const where = (job.assignment?.gpus ?? []).map(g => `GPU ${g.index} (${g.model})`).join(', ');
    const tip =
      `Kernel on ${gpus} GPU${where ? ' of ' + where : ''}, job ${job.id}, project ${job.project}. ` +
      (use ? use.long + ' ' : '') +
      (job.idle_since ? `Idle by use since ${formatIso(job.idle_since)}. ` : '') +
      (typeof used === 'number'
        ? `GPU memory ${formatBytes(used)} used of ${formatBytes(limit)}.`
        : memory
          ? `GPU memory: ${memory}.`
          : 'GPU memory use is not measured here.') +
      ' Click to open the GPU Pool panel.';
    this.node.textContent = text;
    this.node.title = tip;
    this.node.setAttribute('aria-label', tip);
    this.node.dataset.jobId = job.id;
    this.node.dataset.busy = use && use.percent !== null ? String(use.percent) : '';
    delete this.node.dataset.starting;
  }

  /** A kernel still starting: what it waits for, why, and until when. */
  private _renderStarting(share: IKernelShare): void {
    const job = share.job;
    const gpus = job ? formatGpus(jobShare(job)) : '';
    const what = share.starting?.what === 'pod' ? 'starting its pod' : 'waiting for a share';
    const reason = share.starting?.reason || (job?.reason ?? '');
    const until = share.starting ? formatClock(share.starting.gives_up_at) : '';
    const tip =
      (share.starting?.what === 'pod'
        ? 'The kernel has its GPU share; its pod is starting'
        : 'The kernel waits for room for its GPU share') +
      (reason ? `: ${reason}.` : '.') +
      (until ? ` It gives up at ${until} if it still cannot start.` : '') +
      (job ? ` Job ${job.id}, project ${job.project}.` : '') +
      ' Click to open the GPU Pool panel.';
    this.node.textContent = `GPU${gpus ? ' ' + gpus : ''} · ${what}`;
    this.node.title = tip;
    this.node.setAttribute('aria-label', tip);
    this.node.dataset.jobId = job?.id ?? '';
    this.node.dataset.busy = '';
    this.node.dataset.starting = share.starting?.what ?? 'share';
  }
}

/** An ISO time as the local clock time. */
function formatIso(iso: string): string {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? iso : formatClock(t / 1000);
}
