/**
 * The pool over time as a plain SVG chart: GPU shares allocated per project
 * (stacked areas, left axis in GPUs) and the measured GPU utilization where
 * NVML reports one (a dashed line, right axis in percent).
 *
 * Hand-written on purpose: a few paths are all it takes, and a chart library
 * would outweigh the whole extension.
 */
import { IHistorySample } from './api';
import { h, s } from './dom';
import { formatClock, formatGpus } from './format';

const WIDTH = 260;
const HEIGHT = 130;
const PAD = { left: 24, right: 28, top: 8, bottom: 18 };

/** A categorical palette readable on both the light and the dark theme. */
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#9c755f'];

/** A stable color per project name (same in the pool bars and the chart). */
export function projectColor(name: string, names: string[]): string {
  const sorted = [...new Set(names)].sort();
  const i = sorted.indexOf(name);
  if (i >= 0) {
    return PALETTE[i % PALETTE.length];
  }
  let hash = 0;
  for (const ch of name) {
    hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  }
  return PALETTE[hash % PALETTE.length];
}

/** Mean measured utilization of a sample (percent), or null when none is measured. */
export function meanUtilization(sample: IHistorySample): number | null {
  const utils = Object.values(sample.gpus ?? {})
    .map(g => g.util)
    .filter((u): u is number => typeof u === 'number');
  return utils.length > 0 ? utils.reduce((a, b) => a + b, 0) / utils.length : null;
}

/**
 * Render the chart (or a short message when there is nothing to draw yet).
 *
 * `capacity` is the pool size in GPUs, the top of the left axis.
 */
export function renderHistory(samples: IHistorySample[], capacity: number, projectNames: string[]): HTMLElement {
  const sorted = [...samples].sort((a, b) => a.t - b.t);
  if (sorted.length < 2) {
    return h('p', { class: 'jp-gpupool-empty' }, 'Collecting history: the chart appears after a few samples.');
  }
  const names = [...new Set([...projectNames, ...sorted.flatMap(x => Object.keys(x.projects ?? {}))])].sort();
  const t0 = sorted[0].t;
  const t1 = sorted[sorted.length - 1].t;
  const span = Math.max(t1 - t0, 1);
  const peak = Math.max(
    capacity,
    ...sorted.map(x => Object.values(x.projects ?? {}).reduce((a, b) => a + b, 0) / 1000)
  );
  const yMax = peak > 0 ? peak : 1;
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const x = (t: number): number => PAD.left + ((t - t0) / span) * plotW;
  const y = (gpus: number): number => PAD.top + plotH - (gpus / yMax) * plotH;
  const yPct = (pct: number): number => PAD.top + plotH - (Math.min(Math.max(pct, 0), 100) / 100) * plotH;

  const svg = s('svg', {
    class: 'jp-gpupool-chart',
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img',
    preserveAspectRatio: 'xMidYMid meet'
  });

  // Grid and axes.
  for (const frac of [0, 0.5, 1]) {
    const gy = PAD.top + plotH - frac * plotH;
    svg.appendChild(s('line', { x1: PAD.left, x2: WIDTH - PAD.right, y1: gy, y2: gy, class: 'jp-gpupool-grid' }));
    svg.appendChild(
      s('text', { x: PAD.left - 4, y: gy + 3, 'text-anchor': 'end', class: 'jp-gpupool-axis' }, formatGpus(yMax * frac))
    );
  }
  svg.appendChild(s('text', { x: PAD.left, y: HEIGHT - 6, class: 'jp-gpupool-axis' }, formatClock(t0)));
  svg.appendChild(
    s('text', { x: WIDTH - PAD.right, y: HEIGHT - 6, 'text-anchor': 'end', class: 'jp-gpupool-axis' }, formatClock(t1))
  );

  // Stacked areas, one per project, bottom-up in name order.
  const base = sorted.map(() => 0);
  for (const name of names) {
    const top = sorted.map((sample, i) => base[i] + (sample.projects?.[name] ?? 0) / 1000);
    if (top.every((v, i) => v === base[i])) {
      continue;
    }
    const upper = sorted.map((sample, i) => `${x(sample.t).toFixed(1)},${y(top[i]).toFixed(1)}`);
    const lower = sorted
      .map((sample, i) => `${x(sample.t).toFixed(1)},${y(base[i]).toFixed(1)}`)
      .reverse();
    const area = s('polygon', {
      points: [...upper, ...lower].join(' '),
      fill: projectColor(name, projectNames.length ? projectNames : names),
      class: 'jp-gpupool-area',
      'data-project': name
    });
    area.appendChild(s('title', {}, `${name}: ${formatGpus(top[top.length - 1] - base[base.length - 1])} GPU now`));
    svg.appendChild(area);
    top.forEach((v, i) => (base[i] = v));
  }

  // Capacity line.
  svg.appendChild(
    s('line', { x1: PAD.left, x2: WIDTH - PAD.right, y1: y(capacity), y2: y(capacity), class: 'jp-gpupool-capacity' })
  );

  // Utilization, only over the samples that measured it.
  const utilPoints = sorted
    .map(sample => ({ t: sample.t, u: meanUtilization(sample) }))
    .filter((p): p is { t: number; u: number } => p.u !== null);
  if (utilPoints.length >= 2) {
    svg.appendChild(
      s('polyline', {
        points: utilPoints.map(p => `${x(p.t).toFixed(1)},${yPct(p.u).toFixed(1)}`).join(' '),
        class: 'jp-gpupool-util'
      })
    );
    for (const pct of [0, 100]) {
      svg.appendChild(
        s('text', { x: WIDTH - PAD.right + 4, y: yPct(pct) + 3, class: 'jp-gpupool-axis' }, `${pct}%`)
      );
    }
  }

  const last = sorted[sorted.length - 1];
  const nowParts = names
    .filter(n => (last.projects?.[n] ?? 0) > 0)
    .map(n => `${n} ${formatGpus((last.projects[n] ?? 0) / 1000)} GPU`);
  const lastUtil = utilPoints.length ? utilPoints[utilPoints.length - 1].u : null;
  const summary =
    `GPU shares per project from ${formatClock(t0)} to ${formatClock(t1)} on a pool of ${formatGpus(capacity)} GPUs. ` +
    `Now: ${nowParts.length ? nowParts.join(', ') : 'nothing allocated'}.` +
    (lastUtil !== null ? ` Measured utilization ${Math.round(lastUtil)}%.` : ' Utilization is not measured (simulated GPUs).');
  svg.setAttribute('aria-label', summary);
  svg.insertBefore(s('title', {}, summary), svg.firstChild);

  const legend = h(
    'ul',
    { class: 'jp-gpupool-legend', 'aria-hidden': 'true' },
    ...names.map(n =>
      h(
        'li',
        {},
        h('span', { class: 'jp-gpupool-swatch', style: `background:${projectColor(n, projectNames.length ? projectNames : names)}` }),
        n
      )
    ),
    utilPoints.length >= 2 ? h('li', {}, h('span', { class: 'jp-gpupool-swatch jp-gpupool-swatch-util' }), 'GPU utilization') : null
  );
  const figure = h('figure', { class: 'jp-gpupool-figure' });
  figure.append(svg, legend);
  return figure;
}
