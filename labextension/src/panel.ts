/**
 * The GPU Pool sidebar: pool GPUs and their shares, projects against their
 * quotas, allocated vs used per project (useview.ts), the pool over time, the queue (with pause/resume/cancel on the
 * user's own jobs) and one job's detail with its live log and output
 * notebook.
 *
 * It refreshes on scheduler events (shared long-poll) and on a slow timer
 * while visible; nothing polls while the panel is hidden.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api, describeError, IJob, IProject, IStatus } from './api';
import { renderHistory } from './chart';
import { h, replaceChildren } from './dom';
import { EventStream } from './events';
import { formatRequest } from './format';
import { isFinal, jobDetail } from './jobdetail';
import { notifyError } from './notifications';
import { poolView } from './poolview';
import { projectsView } from './projectsview';
import { editProject } from './quota';
import { gangWhere } from './replicas';
import { describeUse } from './usefigures';
import { UseView } from './useview';

const REFRESH_MS = 5000;
const HISTORY_MS = 15000;
const LOG_MS = 2000;
const HISTORY_WINDOW_S = 3600;
const MAX_LOG_CHARS = 200_000;
const MAX_FINISHED_SHOWN = 15;
/** A large queue is summarized past this many live rows (the DOM stays small). */
const MAX_LIVE_SHOWN = 100;
const STATE_ORDER: Record<string, number> = { running: 0, paused: 1, queued: 2 };

export interface IPanelOptions {
  stream: EventStream;
  /** Open a file of the server's contents in Lab. */
  openPath: (path: string) => void;
}

export class GpuPoolPanel extends Widget {
  private _status: IStatus | null = null;
  private _jobs: IJob[] = [];
  private _error = '';
  private _selected: string | null = null;
  private _detailJob: IJob | null = null;
  private _log = '';
  private _logOffset = 0;
  private _logEof = false;
  /** A gang's log shown: null for every replica's lines, else one replica's. */
  private _logReplica: number | null = null;
  private _mineOnly = false;
  private _showKernels = false;
  private _hiddenLive = 0;
  private _moreNote = h('p', { class: 'jp-gpupool-help' });
  private _timer = 0;
  private _historyTimer = 0;
  private _logTimer = 0;
  private _refreshing: Promise<void> | null = null;
  private _pendingRefresh = false;

  private _banner = h('div', { class: 'jp-gpupool-banner', role: 'status', 'aria-live': 'polite' });
  private _summary = h('div', { class: 'jp-gpupool-summary' });
  private _poolBody = h('div', { class: 'jp-gpupool-pool' });
  private _projectsBody = h('div', { class: 'jp-gpupool-projects' });
  private _chartBody = h('div', { class: 'jp-gpupool-history' }, h('p', { class: 'jp-gpupool-empty' }, 'Loading the pool\u2019s history…'));
  private _queueBody = h('div', { class: 'jp-gpupool-queue' });
  private _use = new UseView();
  private _detailSection = h('section', { class: 'jp-gpupool-detail', 'aria-label': 'Job detail', hidden: true });
  private _detailBody = h('div', { class: 'jp-gpupool-detail-body' });
  private _logPre = h('pre', { class: 'jp-gpupool-log', tabindex: 0, 'aria-label': 'Job log' });
  private _jobList = h('ul', { class: 'jp-gpupool-jobs', 'aria-label': 'Jobs' });
  /** Last rendered signature per section/row: unchanged data is not re-rendered (focus and scroll stay). */
  private _signatures = new Map<string, string>();
  private _rows = new Map<string, { sig: string; el: HTMLElement }>();

  constructor(private _options: IPanelOptions) {
    super();
    this.id = 'jp-gpupool-panel';
    this.addClass('jp-gpupool-panel');
    this.title.caption = 'GPU Pool';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU Pool');

    const section = (title: string, body: HTMLElement, extra?: HTMLElement): HTMLElement =>
      h(
        'details',
        { class: 'jp-gpupool-section', open: true },
        h('summary', {}, h('h3', {}, title), extra ?? null),
        body
      );

    const mine = h('input', { type: 'checkbox', id: 'jp-gpupool-mine' });
    mine.addEventListener('change', () => {
      this._mineOnly = mine.checked;
      this._renderQueue();
    });
    const kernels = h('input', { type: 'checkbox', id: 'jp-gpupool-kernels' });
    kernels.addEventListener('change', () => {
      this._showKernels = kernels.checked;
      this._renderQueue();
    });
    const queueFilters = h(
      'div',
      { class: 'jp-gpupool-filters' },
      h('label', { for: 'jp-gpupool-mine' }, mine, ' My jobs only'),
      h('label', { for: 'jp-gpupool-kernels' }, kernels, ' Show kernels')
    );

    const refresh = h(
      'button',
      {
        class: 'jp-gpupool-button jp-gpupool-refresh',
        type: 'button',
        'aria-label': 'Refresh the GPU pool',
        title: 'Refresh'
      },
      'Refresh'
    );
    refresh.addEventListener('click', () => {
      void this.refresh(true);
      void this._use.refresh();
    });

    this.node.append(
      h('header', { class: 'jp-gpupool-header' }, h('h2', {}, 'GPU Pool'), refresh),
      this._banner,
      this._summary,
      section('GPUs', this._poolBody),
      section('Projects', this._projectsBody),
      section('Allocated vs used', this._use.node),
      section('Pool over time', this._chartBody),
      section('Queue', h('div', {}, queueFilters, this._queueBody)),
      this._detailSection
    );
    this._detailSection.append(this._detailBody, h('h4', {}, 'Log'), this._logPre);

    _options.stream.received.connect(this._onEvents, this);
  }

  /** The last status (null before the first successful refresh). */
  get status(): IStatus | null {
    return this._status;
  }

  /** The user's name once known. */
  get me(): string | null {
    return this._status?.me ?? null;
  }

  dispose(): void {
    this._stopTimers();
    window.clearInterval(this._logTimer);
    super.dispose();
  }

  /** Fetch status and jobs and re-render (coalesces overlapping calls). */
  async refresh(force = false): Promise<void> {
    if (this._refreshing) {
      this._pendingRefresh = this._pendingRefresh || force;
      return this._refreshing;
    }
    this._refreshing = this._doRefresh();
    try {
      await this._refreshing;
    } finally {
      this._refreshing = null;
      if (this._pendingRefresh) {
        this._pendingRefresh = false;
        void this.refresh();
      }
    }
  }

  /** Show one job's detail (and make sure the panel is refreshed). */
  async showJob(id: string): Promise<void> {
    if (this._selected !== id) {
      this._selected = id;
      this._log = '';
      this._logOffset = 0;
      this._logEof = false;
      this._logReplica = null;
      replaceChildren(this._logPre);
      this._signatures.delete('detail');
    }
    await this._loadDetail();
    this._renderQueue();
    this._detailSection.scrollIntoView({ block: 'nearest' });
    const heading = this._detailSection.querySelector('h3');
    (heading as HTMLElement | null)?.focus();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
    void this._refreshHistory();
    this._startTimers();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._stopTimers();
  }

  private _startTimers(): void {
    this._stopTimers();
    this._timer = window.setInterval(() => void this.refresh(), REFRESH_MS);
    this._historyTimer = window.setInterval(() => void this._refreshHistory(), HISTORY_MS);
  }

  private _stopTimers(): void {
    window.clearInterval(this._timer);
    window.clearInterval(this._historyTimer);
  }

  private _onEvents(): void {
    if (this.isVisible) {
      void this.refresh();
    }
  }

  private async _doRefresh(): Promise<void> {
    try {
      const [status, jobs] = await Promise.all([api.status(), api.jobs()]);
      this._status = status;
      this._jobs = jobs;
      this._error = '';
    } catch (err) {
      this._error = describeError(err);
    }
    this._render();
    if (this._selected) {
      await this._loadDetail();
    }
  }

  private async _refreshHistory(): Promise<void> {
    if (!this._status) {
      await this.refresh();
    }
    void this._use.refresh();
    try {
      const reply = await api.history(Date.now() / 1000 - HISTORY_WINDOW_S);
      const capacity = this._capacity();
      const names = (this._status?.projects ?? []).map(p => p.name);
      replaceChildren(this._chartBody, renderHistory(reply.samples ?? [], capacity, names));
    } catch (err) {
      replaceChildren(this._chartBody, h('p', { class: 'jp-gpupool-empty' }, `No history: ${describeError(err)}`));
    }
  }

  private _capacity(): number {
    return (this._status?.pool.nodes ?? []).reduce((n, node) => n + node.gpus.length, 0);
  }

  private _render(): void {
    this._renderBanner();
    if (!this._status) {
      return;
    }
    const status = this._status;
    const names = status.projects.map(p => p.name);
    this._renderSection('summary', [status.me, status.admin, status.project, status.simulated, status.queue], () =>
      this._renderSummary(status)
    );
    this._renderSection('pool', [status.pool, names], () => this._renderPool(status));
    this._renderSection('projects', [status.projects, status.admin], () => this._renderProjects(status));
    this._use.setJobs(this._jobs, names);
    this._renderQueue();
  }

  /** Re-render a section only when its data changed, keeping keyboard focus where it was. */
  private _renderSection(key: string, data: unknown, render: () => void): void {
    const sig = JSON.stringify(data);
    if (this._signatures.get(key) === sig) {
      return;
    }
    this._signatures.set(key, sig);
    keepFocus(this.node, render);
  }

  private _renderBanner(): void {
    if (!this._error) {
      this._banner.hidden = true;
      replaceChildren(this._banner);
      return;
    }
    this._banner.hidden = false;
    const retry = h('button', { class: 'jp-gpupool-button', type: 'button', 'aria-label': 'Retry' }, 'Retry');
    retry.addEventListener('click', () => void this.refresh(true));
    replaceChildren(
      this._banner,
      h('span', { class: 'jp-gpupool-error' }, this._error),
      ' ',
      this._status ? h('span', { class: 'jp-gpupool-help' }, '(showing the last known state)') : '',
      retry
    );
  }

  private _renderSummary(status: IStatus): void {
    const q = status.queue ?? { pending: 0, running: 0, paused: 0 };
    replaceChildren(
      this._summary,
      h(
        'p',
        {},
        h('strong', {}, status.me),
        status.admin ? h('span', { class: 'jp-gpupool-badge', title: 'You can edit project quotas' }, 'admin') : '',
        status.project ? ` · project ${status.project}` : '',
        status.simulated ? h('span', { class: 'jp-gpupool-badge jp-gpupool-badge-sim', title: 'Simulated GPUs' }, 'simulated') : ''
      ),
      h('p', { class: 'jp-gpupool-help' }, `${q.running} running · ${q.pending} pending · ${q.paused} paused`)
    );
  }

  private _renderPool(status: IStatus): void {
    replaceChildren(this._poolBody, poolView(status));
  }

  private _renderProjects(status: IStatus): void {
    replaceChildren(this._projectsBody, ...projectsView(status, project => void this._edit(project)));
  }

  private async _edit(project: IProject | null): Promise<void> {
    const saved = await editProject(project);
    if (saved) {
      await this.refresh(true);
    }
  }

  private _visibleJobs(): IJob[] {
    const me = this.me;
    let jobs = this._jobs.filter(j => this._showKernels || j.kind !== 'build');
    if (this._mineOnly && me) {
      jobs = jobs.filter(j => j.user === me);
    }
    // Running first, then paused, then the queue in the order it is served (priority, then age).
    const live = jobs
      .filter(j => !isFinal(j))
      .sort(
        (a, b) =>
          (STATE_ORDER[a.state] ?? 3) - (STATE_ORDER[b.state] ?? 3) ||
          b.priority - a.priority ||
          a.submitted_at - b.submitted_at
      );
    this._hiddenLive = Math.max(0, live.length - MAX_LIVE_SHOWN);
    const finished = jobs.filter(j => isFinal(j)).slice(0, MAX_FINISHED_SHOWN);
    return [...live.slice(0, MAX_LIVE_SHOWN), ...finished];
  }

  private _renderQueue(): void {
    if (!this._status) {
      return;
    }
    const jobs = this._visibleJobs();
    if (jobs.length === 0) {
      this._rows.clear();
      replaceChildren(this._queueBody, h('p', { class: 'jp-gpupool-empty' }, 'No jobs. Promote a notebook to start one.'));
      return;
    }
    if (this._jobList.parentNode !== this._queueBody) {
      replaceChildren(this._queueBody, this._jobList, this._moreNote);
    }
    this._moreNote.textContent = this._hiddenLive
      ? `…and ${this._hiddenLive} more live jobs further back in the queue.`
      : '';
    keepFocus(this._jobList, () => {
      const rows = jobs.map(job => {
        const sig = JSON.stringify([job, job.id === this._selected, this._canControl(job)]);
        const cached = this._rows.get(job.id);
        if (cached && cached.sig === sig) {
          return cached.el;
        }
        const el = this._jobRow(job);
        this._rows.set(job.id, { sig, el });
        return el;
      });
      const shown = new Set(jobs.map(j => j.id));
      for (const id of [...this._rows.keys()]) {
        if (!shown.has(id)) {
          this._rows.delete(id);
        }
      }
      // Move only what is out of place, so an unchanged row (and a focused button in it) stays put.
      rows.forEach((el, i) => {
        if (this._jobList.children[i] !== el) {
          this._jobList.insertBefore(el, this._jobList.children[i] ?? null);
        }
      });
      while (this._jobList.children.length > rows.length) {
        this._jobList.lastElementChild?.remove();
      }
    });
  }

  private _canControl(job: IJob): boolean {
    return !!this._status && (this._status.admin || job.user === this._status.me);
  }

  private _jobRow(job: IJob): HTMLElement {
    const open = (): void => void this.showJob(job.id);
    const row = h(
      'li',
      {
        class: `jp-gpupool-job jp-gpupool-state-${job.state}${job.id === this._selected ? ' jp-mod-selected' : ''}`,
        'data-job-id': job.id,
        'data-state': job.state
      },
      h(
        'button',
        {
          class: 'jp-gpupool-job-open',
          type: 'button',
          'aria-label': `Show job ${job.id} ${job.name}, ${job.state}`,
          title: job.reason || job.state,
          onclick: open
        },
        h('span', { class: 'jp-gpupool-job-name' }, job.name || job.id),
        h('span', { class: `jp-gpupool-state jp-gpupool-state-${job.state}` }, job.state)
      ),
      h(
        'div',
        { class: 'jp-gpupool-help' },
        `${job.id} · ${job.project} · ${job.user} · ${job.kind === 'build' ? 'kernel ' : ''}${formatRequest(job.request)}` +
          gangWhere(job) +
          (job.priority ? ` · prio ${job.priority}` : '') +
          (job.state === 'running' ? ` · ${describeUse(job).short}` : ''),
        job.state === 'running' && job.idle_since
          ? h('span', { class: 'jp-gpupool-flag', title: `Idle by use since ${job.idle_since}` }, ' \u26A0 idle')
          : null
      ),
      this._actions(job)
    );
    return row;
  }

  private _actions(job: IJob): HTMLElement | null {
    if (!this._canControl(job) || isFinal(job)) {
      return null;
    }
    const buttons: HTMLElement[] = [];
    const add = (action: 'pause' | 'resume' | 'cancel', label: string, title?: string): void => {
      const b = h(
        'button',
        {
          class: `jp-gpupool-button jp-gpupool-${action}`,
          type: 'button',
          'aria-label': `${label} job ${job.id}`,
          title
        },
        label
      );
      b.addEventListener('click', () => void this._act(job, action));
      buttons.push(b);
    };
    if (job.kind === 'train' && job.state === 'running') {
      add('pause', 'Pause');
    }
    if (job.state === 'paused') {
      add('resume', 'Resume');
    }
    if (job.kind === 'build') {
      // A kernel's share: cancelling gives the GPU back; the kernel itself is not stopped.
      add('cancel', 'Release', "Give this kernel's GPU share back to the pool (shut the kernel down to stop it)");
    } else {
      add('cancel', 'Cancel');
    }
    return h('div', { class: 'jp-gpupool-actions' }, ...buttons);
  }

  private async _act(job: IJob, action: 'pause' | 'resume' | 'cancel'): Promise<void> {
    try {
      await api.action(job.id, action);
    } catch (err) {
      notifyError(`Could not ${action} job ${job.id}`, err);
    }
    await this.refresh(true);
  }

  private async _loadDetail(): Promise<void> {
    const id = this._selected;
    if (!id) {
      return;
    }
    try {
      this._detailJob = await api.job(id);
    } catch (err) {
      this._detailJob = null;
      this._renderDetail(describeError(err));
      return;
    }
    this._renderDetail('');
    await this._pollLog();
    window.clearInterval(this._logTimer);
    if (!this._logEof || (this._detailJob && !isFinal(this._detailJob))) {
      this._logTimer = window.setInterval(() => void this._pollLog(), LOG_MS);
    }
  }

  private async _pollLog(): Promise<void> {
    const job = this._detailJob;
    if (!job || job.id !== this._selected || !this.isVisible) {
      return;
    }
    const replica = this._logReplica;
    try {
      const chunk = await api.logs(job.id, this._logOffset, replica);
      if (replica !== this._logReplica) {
        return; // the user picked another replica's log meanwhile
      }
      if (chunk.data) {
        this._log = (this._log + chunk.data).slice(-MAX_LOG_CHARS);
        const atBottom = this._logPre.scrollTop + this._logPre.clientHeight >= this._logPre.scrollHeight - 8;
        this._logPre.textContent = this._log;
        if (atBottom) {
          this._logPre.scrollTop = this._logPre.scrollHeight;
        }
      } else if (!this._log) {
        this._logPre.textContent = '(no output yet)';
      }
      this._logOffset = chunk.offset;
      this._logEof = chunk.eof;
      if (chunk.eof && isFinal(job)) {
        window.clearInterval(this._logTimer);
      }
    } catch (err) {
      this._logPre.textContent = `${this._log}\n[log unavailable: ${describeError(err)}]`;
      window.clearInterval(this._logTimer);
    }
  }

  private _renderDetail(error: string): void {
    this._detailSection.hidden = false;
    const sig = JSON.stringify([this._selected, this._detailJob, error, this._status?.me, this._status?.admin]);
    if (this._signatures.get('detail') === sig) {
      return;
    }
    this._signatures.set('detail', sig);
    keepFocus(this._detailSection, () => this._renderDetailBody(error));
  }

  private _renderDetailBody(error: string): void {
    const close = h(
      'button',
      { class: 'jp-gpupool-button', type: 'button', 'aria-label': 'Close job detail' },
      'Close'
    );
    close.addEventListener('click', () => {
      this._selected = null;
      this._detailJob = null;
      window.clearInterval(this._logTimer);
      this._detailSection.hidden = true;
      this._signatures.delete('detail');
      this._renderQueue();
    });
    const job = this._detailJob;
    if (!job) {
      replaceChildren(
        this._detailBody,
        h('header', {}, h('h3', { tabindex: -1 }, `Job ${this._selected}`), close),
        h('p', { class: 'jp-gpupool-error', role: 'alert' }, error)
      );
      return;
    }
    replaceChildren(
      this._detailBody,
      ...jobDetail(job, {
        // on a pool of several nodes a GPU index alone does not say which GPU: name the node too
        multiNode: (this._status?.pool.nodes ?? []).length > 1,
        openPath: this._options.openPath,
        close,
        control: this._actions(job),
        logReplica: this._logReplica,
        switchLog: replica => void this._switchLog(replica)
      })
    );
  }

  /** Show another replica's log (or all of them) from its beginning. */
  private async _switchLog(replica: number | null): Promise<void> {
    this._logReplica = replica;
    this._log = '';
    this._logOffset = 0;
    this._logEof = false;
    this._logPre.textContent = '';
    await this._pollLog();
    window.clearInterval(this._logTimer);
    if (!this._logEof || (this._detailJob && !isFinal(this._detailJob))) {
      this._logTimer = window.setInterval(() => void this._pollLog(), LOG_MS);
    }
  }
}

/**
 * Run a re-render of part of `root`; if keyboard focus was on a control inside it,
 * put it back on the control with the same accessible name afterwards.
 */
function keepFocus(root: HTMLElement, render: () => void): void {
  const active = document.activeElement as HTMLElement | null;
  const label = active && root.contains(active) ? active.getAttribute('aria-label') : null;
  render();
  if (label && !(document.activeElement && root.contains(document.activeElement))) {
    const again = Array.from(root.querySelectorAll<HTMLElement>('[aria-label]')).find(
      el => el.getAttribute('aria-label') === label
    );
    again?.focus();
  }
}

