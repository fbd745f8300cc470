/**
 * Allocated vs used in words and sums, shared by the status bar, the panel's queue and its charts.
 *
 * Pure functions of the scheduler's replies (no DOM, no requests), so the
 * browser tests' unit specs check them directly (tests/usefigures.spec.ts).
 * Unmeasured is not idle: a share whose use is unknown reads "no use data",
 * never 0 %.
 */
import type { IJob, IUseSeries } from './api';
import { formatDuration } from './format';

/** Which work a chart shows: training and kernels together, or one kind. */
export type Kind = 'all' | 'train' | 'build';

/**
 * The running job's recent use in words: `short` for the bar ("37 % busy", "no use data"), `long` for the
 * tooltip, `percent` (null when unknown).
 */
export function describeUse(job: IJob): { short: string; long: string; percent: number | null } {
  const use = job.recent_use;
  if (!use) {
    return { short: 'no use data', long: 'No use data yet: the scheduler has not sampled this share.', percent: null };
  }
  const minute = use.window_s === 60 ? 'the last minute' : `the last ${formatDuration(use.window_s)}`;
  if (use.busy === null) {
    return {
      short: 'no use data',
      long: `Its GPU use cannot be measured here (no per-process readings), so it is unknown over ${minute}, not idle.`,
      percent: null
    };
  }
  const percent = Math.round(use.busy * 100);
  const partly = use.measured < 0.999 ? ` (measured on ${Math.round(use.measured * 100)} % of the share)` : '';
  return {
    short: `${percent} % busy`,
    long: `Its processes kept ${percent} % of the share busy over ${minute}${partly}.`,
    percent
  };
}

/** A project's figures over the shown range, each a list per bucket (mean GPUs). */
export interface ISums {
  t: number[];
  allocated: number[];
  measured: number[];
  used: number[];
}

/** Sum the series of one project over the kinds shown. */
export function projectSums(series: IUseSeries[], project: string, kind: Kind): ISums | null {
  const mine = series.filter(x => x.project === project && (kind === 'all' || x.kind === kind));
  if (mine.length === 0) {
    return null;
  }
  const t = mine[0].t;
  const add = (key: 'allocated' | 'measured' | 'used'): number[] =>
    t.map((_, i) => mine.reduce((a, x) => a + (x[key][i] ?? 0), 0));
  return { t, allocated: add('allocated'), measured: add('measured'), used: add('used') };
}

/** The figures from bucket `from` on. */
export function sliceSums(sums: ISums, from: number): ISums {
  return {
    t: sums.t.slice(from),
    allocated: sums.allocated.slice(from),
    measured: sums.measured.slice(from),
    used: sums.used.slice(from)
  };
}

/** GPU-hours as a short number ("0.42", "<0.01", "120"). */
export function hours(value: number): string {
  if (value > 0 && value < 0.01) {
    return '<0.01';
  }
  return String(Number(value.toFixed(value >= 100 ? 0 : 2)));
}

/**
 * A chart's range in GPU-hours (each bucket's mean times its length): held, used (at most what was
 * measured), not measured, and the efficiency in percent (used over measured; null when nothing was
 * measured), with the line shown under the chart.
 */
export function useTotals(
  sums: ISums,
  step: number
): { held: number; used: number; unmeasured: number; efficiency: number | null; line: string } {
  const total = (v: number[]): number => (v.reduce((a, b) => a + b, 0) * step) / 3600;
  const held = total(sums.allocated);
  const measured = total(sums.measured);
  const used = total(sums.used.map((u, i) => Math.min(u, sums.measured[i])));
  const efficiency = measured > 0 ? Math.round((used / measured) * 100) : null;
  const unmeasured = Math.max(0, held - measured);
  const line =
    `${hours(held)} GPU-h held · ${hours(used)} used` +
    (efficiency !== null ? ` (${efficiency} % of measured)` : '') +
    (unmeasured > 0.005 ? ` · ${hours(unmeasured)} not measured` : '');
  return { held, used, unmeasured, efficiency, line };
}
