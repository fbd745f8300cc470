/**
 * The GPU Pool panel's "Allocated vs used" section: per project, the GPUs it
 * held over time split into used, idle (measured, not used) and unmeasured
 * (held where use cannot be measured: unknown, never counted idle), from the
 * scheduler's series (GET /gpupool/api/use); above them, the running jobs
 * whose share the scheduler flagged idle by use (`idle_since`, set by the
 * scheduler's idle watch: nothing is judged idle here).
 *
 * The chart a team lead shows their manager: a range (hour, day, week, 30
 * days; the charts start where the first of them held a GPU), training and
 * kernels together or apart, and under each chart the range's GPU-hours and
 * efficiency (used over measured).
 */
import { api, describeError, IJob, IUseSeriesReply } from './api';
import { projectColor } from './chart';
import { h, replaceChildren, s } from './dom';
import { formatClock, formatGpus, formatRequest } from './format';
import { ISums, Kind, projectSums, sliceSums, useTotals } from './usefigures';

const WIDTH = 260;
const HEIGHT = 84;
const PAD = { left: 24, right: 6, top: 6, bottom: 16 };

const RANGES: { label: string; seconds: number }[] = [
  { label: 'Last hour', seconds: 3600 },
  { label: 'Last day', seconds: 86400 },
  { label: 'Last 7 days', seconds: 7 * 86400 },
  { label: 'Last 30 days', seconds: 30 * 86400 }
];
const KINDS: { value: Kind; label: string }[] = [
  { value: 'all', label: 'Training and kernels' },
  { value: 'train', label: 'Training' },
  { value: 'build', label: 'Kernels' }
];

/** The section's own state (range, kind) and its DOM; the panel calls `refresh` and `setJobs`. */
export class UseView {
  readonly node = h('div', { class: 'jp-gpupool-use' });
  private _range = RANGES[0].seconds;
  private _kind: Kind = 'all';
  private _reply: IUseSeriesReply | null = null;
  private _error = '';
  private _jobs: IJob[] = [];
  private _idleSig = '[]';
  private _names: string[] = [];
  private _idleBody = h('div', { class: 'jp-gpupool-idle-list' });
  private _chartsBody = h('div', { class: 'jp-gpupool-use-charts' }, h('p', { class: 'jp-gpupool-empty' }, 'Loading…'));

  constructor() {
    const range = h('select', { class: 'jp-gpupool-select', 'aria-label': 'Range of the allocated vs used charts' });
    for (const r of RANGES) {
      range.appendChild(h('option', { value: String(r.seconds) }, r.label));
    }
    range.addEventListener('change', () => {
      this._range = Number(range.value);
      void this.refresh();
    });
    const kind = h('select', { class: 'jp-gpupool-select', 'aria-label': 'Kind of work in the allocated vs used charts' });
    for (const k of KINDS) {
      kind.appendChild(h('option', { value: k.value }, k.label));
    }
    kind.addEventListener('change', () => {
      this._kind = kind.value as Kind;
      this._renderCharts();
    });
    this.node.append(this._idleBody, h('div', { class: 'jp-gpupool-filters' }, range, kind), this._chartsBody);
  }

  /** Fetch the series for the range shown and redraw the charts. */
  async refresh(): Promise<void> {
    try {
      this._reply = await api.use(Date.now() / 1000 - this._range);
      this._error = '';
    } catch (err) {
      this._error = describeError(err);
    }
    this._renderCharts();
  }

  /** The jobs (for the idle flags) and the project names (for their colours) of the panel's last refresh. */
  setJobs(jobs: IJob[], names: string[]): void {
    const idle = jobs.filter(j => j.state === 'running' && j.idle_since);
    const sig = JSON.stringify(idle.map(j => [j.id, j.name, j.idle_since, j.idle_action]));
    this._names = names;
    if (sig !== this._idleSig) {
      this._idleSig = sig;
      this._jobs = idle;
      this._renderIdle();
    }
  }

  private _renderIdle(): void {
    if (this._jobs.length === 0) {
      replaceChildren(this._idleBody);
      return;
    }
    replaceChildren(
      this._idleBody,
      h(
        'ul',
        { class: 'jp-gpupool-idle', 'aria-label': 'Idle allocations' },
        ...this._jobs.map(j =>
          h(
            'li',
            { 'data-job-id': j.id },
            h('span', { class: 'jp-gpupool-flag' }, '\u26A0 idle'),
            ` ${j.name || j.id} · ${j.project} · ${j.user} · ${j.kind === 'build' ? 'kernel ' : ''}` +
              `${formatRequest(j.request)} since ${idleClock(j.idle_since)}` +
              (j.idle_action && j.idle_action !== 'flag' ? ` (${j.idle_action === 'cull' ? 'to be shut down' : 'to be paused'})` : '')
          )
        )
      )
    );
  }

  private _renderCharts(): void {
    if (this._error) {
      replaceChildren(this._chartsBody, h('p', { class: 'jp-gpupool-empty' }, `No allocated vs used figures: ${this._error}`));
      return;
    }
    const reply = this._reply;
    if (!reply) {
      return;
    }
    const projects = [...new Set(reply.series.map(x => x.project ?? ''))].filter(Boolean).sort();
    const shown = projects
      .map(p => ({ p, sums: projectSums(reply.series, p, this._kind) }))
      .filter((x): x is { p: string; sums: ISums } => !!x.sums && x.sums.allocated.some(v => v > 0));
    // Every chart starts where the first of them held something (one time axis for all, no empty stretch).
    const from = Math.min(...shown.map(x => x.sums.allocated.findIndex(v => v > 0)));
    const charts = shown.map(({ p, sums }) =>
      useChart(p, sliceSums(sums, from), reply.step, projectColor(p, this._names.length ? this._names : projects))
    );
    if (charts.length === 0) {
      replaceChildren(
        this._chartsBody,
        h('p', { class: 'jp-gpupool-empty' }, 'Nothing held in this range yet: the charts fill in as GPUs are used.')
      );
      return;
    }
    const legend = h(
      'ul',
      { class: 'jp-gpupool-legend', 'aria-hidden': 'true' },
      h('li', {}, h('span', { class: 'jp-gpupool-swatch jp-gpupool-swatch-used' }), 'used'),
      h('li', {}, h('span', { class: 'jp-gpupool-swatch jp-gpupool-swatch-idle' }), 'idle (held, not used)'),
      h('li', {}, h('span', { class: 'jp-gpupool-swatch jp-gpupool-swatch-unmeasured' }), 'not measured')
    );
    replaceChildren(this._chartsBody, legend, ...charts);
  }
}

function idleClock(iso: string | null | undefined): string {
  const t = iso ? Date.parse(iso) : NaN;
  return Number.isNaN(t) ? String(iso) : formatClock(t / 1000);
}

/** One project's chart: used, idle and unmeasured GPUs stacked up to what it held, and the range's totals. */
export function useChart(project: string, sums: ISums, step: number, color: string): HTMLElement {
  const n = sums.t.length;
  // (a bucket takes each sampled interval by its middle, so a quarter GPU may read 0.2512: shown to 0.01)
  const peak = Math.round(Math.max(...sums.allocated, 0) * 100) / 100;
  const yMax = Math.max(0.25, Math.ceil(peak * 4 - 0.05) / 4); // a quarter GPU up, within a bucket's jitter
  const t0 = sums.t[0];
  const t1 = sums.t[n - 1] + step;
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const x = (t: number): number => PAD.left + ((t - t0) / Math.max(t1 - t0, 1)) * plotW;
  const y = (gpus: number): number => PAD.top + plotH - (Math.min(gpus, yMax) / yMax) * plotH;
  const svg = s('svg', { class: 'jp-gpupool-use-chart', viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: 'img' });
  for (const frac of [0, 1]) {
    const gy = PAD.top + plotH - frac * plotH;
    svg.appendChild(s('line', { x1: PAD.left, x2: WIDTH - PAD.right, y1: gy, y2: gy, class: 'jp-gpupool-grid' }));
    svg.appendChild(
      s('text', { x: PAD.left - 4, y: gy + 3, 'text-anchor': 'end', class: 'jp-gpupool-axis' }, formatGpus(yMax * frac))
    );
  }
  svg.appendChild(s('text', { x: PAD.left, y: HEIGHT - 4, class: 'jp-gpupool-axis' }, formatClock(t0)));
  svg.appendChild(
    s('text', { x: WIDTH - PAD.right, y: HEIGHT - 4, 'text-anchor': 'end', class: 'jp-gpupool-axis' }, formatClock(t1))
  );
  // Bands bottom-up, each a step line (a bucket's mean is flat over the bucket): used, idle, not measured.
  const used = sums.used.map((u, i) => Math.min(u, sums.measured[i]));
  const bands: { name: string; lower: number[]; upper: number[]; cls: string }[] = [
    { name: 'used', lower: sums.t.map(() => 0), upper: used, cls: 'jp-gpupool-use-used' },
    { name: 'idle', lower: used, upper: sums.measured, cls: 'jp-gpupool-use-idle' },
    { name: 'unmeasured', lower: sums.measured, upper: sums.allocated, cls: 'jp-gpupool-use-unmeasured' }
  ];
  for (const band of bands) {
    if (band.upper.every((v, i) => v <= band.lower[i] + 1e-9)) {
      continue;
    }
    const upper: string[] = [];
    const lower: string[] = [];
    sums.t.forEach((t, i) => {
      const a = x(t).toFixed(1);
      const b = x(t + step).toFixed(1);
      upper.push(`${a},${y(band.upper[i]).toFixed(1)}`, `${b},${y(band.upper[i]).toFixed(1)}`);
      lower.push(`${a},${y(band.lower[i]).toFixed(1)}`, `${b},${y(band.lower[i]).toFixed(1)}`);
    });
    svg.appendChild(
      s('polygon', {
        points: [...upper, ...lower.reverse()].join(' '),
        class: `jp-gpupool-area ${band.cls}`,
        fill: band.name === 'unmeasured' ? 'var(--jp-layout-color4)' : color,
        'data-band': band.name
      })
    );
  }
  const { efficiency, line } = useTotals(sums, step);
  const label =
    `${project}: allocated vs used GPUs from ${formatClock(t0)} to ${formatClock(t1)}, at most ${formatGpus(peak)} GPU ` +
    `held. ${line}.` +
    (efficiency === null ? ' Its use could not be measured: unknown, not idle.' : '');
  svg.setAttribute('aria-label', label);
  svg.insertBefore(s('title', {}, label), svg.firstChild);
  return h(
    'figure',
    { class: 'jp-gpupool-figure jp-gpupool-use-figure', 'data-project': project },
    h('figcaption', {}, h('span', { class: 'jp-gpupool-swatch', style: `background:${color}` }), project),
    svg,
    h('div', { class: 'jp-gpupool-help jp-gpupool-use-totals' }, line)
  );
}
