/**
 * Unit tests of how allocated vs used is worded and summed (src/usefigures.ts): the status bar's and
 * the queue's "N % busy", and the charts' per-project sums and GPU-hours. No browser page is used.
 */
import { expect, test } from '@playwright/test';

import type { IJob, IUseSeries } from '../../src/api';
import { describeUse, projectSums, sliceSums, useTotals } from '../../src/usefigures';

function running(recent: IJob['recent_use']): IJob {
  return { id: 'j-000007', state: 'running', recent_use: recent } as IJob;
}

test.describe('allocated vs used figures', () => {
  test('the recent use reads as a percent of the share, and unknown is never 0 %', () => {
    const busy = describeUse(running({ window_s: 60, busy: 0.374, measured: 1, peak_memory: 0 }));
    expect(busy.short).toBe('37 % busy');
    expect(busy.percent).toBe(37);
    expect(busy.long).toBe('Its processes kept 37 % of the share busy over the last minute.');
    expect(describeUse(running({ window_s: 60, busy: 0, measured: 1, peak_memory: 0 })).short).toBe('0 % busy');
    const partly = describeUse(running({ window_s: 60, busy: 0.5, measured: 0.5, peak_memory: 0 }));
    expect(partly.long).toContain('(measured on 50 % of the share)');
    // nothing measured (no per-process readings), or no sample yet: no figure at all
    const unmeasured = describeUse(running({ window_s: 60, busy: null, measured: 0, peak_memory: 0 }));
    expect(unmeasured.short).toBe('no use data');
    expect(unmeasured.percent).toBeNull();
    expect(unmeasured.long).toContain('unknown over the last minute, not idle');
    expect(describeUse(running(null)).short).toBe('no use data');
    expect(describeUse(running(undefined)).short).toBe('no use data');
  });

  test("a project's charts sum its kinds, and the totals are hand-computable", () => {
    const t = [0, 600, 1200];
    const series: IUseSeries[] = [
      // training: a GPU for the first two buckets, half used; kernels: a quarter throughout, unmeasured at first
      { project: 'vision', kind: 'train', t, allocated: [1, 1, 0], measured: [1, 1, 0], used: [0.5, 0.5, 0] },
      { project: 'vision', kind: 'build', t, allocated: [0.25, 0.25, 0.25], measured: [0, 0.25, 0.25], used: [0, 0.1, 0.3] },
      { project: 'nlp', kind: 'train', t, allocated: [2, 2, 2], measured: [2, 2, 2], used: [0, 0, 0] }
    ];
    const all = projectSums(series, 'vision', 'all');
    expect(all).toEqual({ t, allocated: [1.25, 1.25, 0.25], measured: [1, 1.25, 0.25], used: [0.5, 0.6, 0.3] });
    expect(projectSums(series, 'vision', 'build')?.allocated).toEqual([0.25, 0.25, 0.25]);
    expect(projectSums(series, 'nlp', 'build')).toBeNull();
    // 10-minute buckets: held (1.25 + 1.25 + 0.25) / 6 GPU-h; used at most what was measured per bucket
    // (the last bucket's 0.3 counts 0.25): (0.5 + 0.6 + 0.25) / 6; measured (1 + 1.25 + 0.25) / 6
    const totals = useTotals(all!, 600);
    expect(totals.held).toBeCloseTo(2.75 / 6, 9);
    expect(totals.used).toBeCloseTo(1.35 / 6, 9);
    expect(totals.unmeasured).toBeCloseTo(0.25 / 6, 9);
    expect(totals.efficiency).toBe(54); // 1.35 / 2.5
    expect(totals.line).toBe('0.46 GPU-h held · 0.23 used (54 % of measured) · 0.04 not measured');
    const idle = useTotals(projectSums(series, 'nlp', 'all')!, 600);
    expect(idle.line).toBe('1 GPU-h held · 0 used (0 % of measured)');
    const blind = useTotals({ t: [0], allocated: [1], measured: [0], used: [0] }, 3600);
    expect(blind.efficiency).toBeNull();
    expect(blind.line).toBe('1 GPU-h held · 0 used · 1 not measured');
    expect(sliceSums(all!, 1).t).toEqual([600, 1200]);
  });
});
