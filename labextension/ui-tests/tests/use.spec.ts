/**
 * Allocated vs used in the browser (issue 26, item 3): the status bar says how
 * busy the current kernel keeps its share ("GPU ¼ · 37 % busy"), and the GPU
 * Pool panel charts, per project, the GPUs held over time split into used,
 * idle and not measured, with the idle allocations flagged.
 *
 * On simulated GPUs the work reports its own use (gpupool.sim_use): the
 * kernel from a cell, the two training notebooks from theirs. The admin gives
 * project nlp a 2 s idle window for training with the action "flag" (through
 * the scheduler's API with the test server's admin token, as an admin would
 * with `gpupool projects`), so its idle job is flagged; it goes back to the
 * default at the end. The screenshot is the README's allocated-vs-used picture.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import type { APIRequestContext } from '@playwright/test';
import * as path from 'path';

import { setProject } from './pool_admin';

const SHOTS = process.env.GPUPOOL_SCREENSHOTS_DIR || path.resolve(__dirname, '..', 'screenshots');

async function setIdleRule(request: APIRequestContext, project: string, idle: unknown): Promise<void> {
  await setProject(request, project, { idle });
}

/** A training notebook that says how busy its GPU is, then works (sleeps) for `seconds`. */
function busyNotebook(busy: number, seconds: number): string {
  const cell = (source: string, tags: string[] = []) => ({
    cell_type: 'code',
    execution_count: null,
    metadata: { tags },
    outputs: [],
    source
  });
  return JSON.stringify({
    cells: [
      cell(`busy = ${busy}\nseconds = ${seconds}`, ['parameters']),
      cell('import time, gpupool\nprint("reported", gpupool.sim_use(busy=busy), flush=True)\ntime.sleep(seconds)')
    ],
    metadata: {
      kernelspec: { display_name: 'Python 3 (ipykernel)', language: 'python', name: 'python3' },
      language_info: { name: 'python' }
    },
    nbformat: 4,
    nbformat_minor: 5
  });
}

// Galata's kernel mock also catches /gpupool/api/kernels: off, as in gpupool.spec.ts.
test.use({ autoGoto: true, kernels: null });

test.describe('allocated vs used', () => {
  const started: string[] = [];

  test.afterEach(async ({ page }) => {
    for (const id of started.splice(0)) {
      await page.request.post(`/gpupool/api/jobs/${id}/cancel`);
    }
    await setIdleRule(page.request, 'nlp', null);
    await page.evaluate(async () => {
      await (window as any).jupyterapp.serviceManager.sessions.shutdownAll();
    });
  });

  test('the status bar says how busy the kernel is; the panel charts allocated vs used and flags idle work', async ({
    page,
    tmpPath
  }) => {
    test.setTimeout(240000);
    await setIdleRule(page.request, 'nlp', { train: { window_s: 2, action: 'flag' } });
    // Two training runs: vision's keeps 80 % of its GPU busy, nlp's holds one and leaves it idle.
    for (const [project, busy] of [
      ['vision', 0.8],
      ['nlp', 0.0]
    ] as const) {
      const name = `${project}-run.ipynb`;
      await page.contents.uploadContent(busyNotebook(busy, 200), 'text', `${tmpPath}/${name}`);
      const reply = await page.request.post('/gpupool/api/promote', {
        data: { path: `${tmpPath}/${name}`, project, gpus: 1 }
      });
      expect(reply.ok(), await reply.text()).toBe(true);
      started.push((await reply.json()).id);
    }

    // A ¼ GPU kernel: sampled before it says anything, its share reads idle (0 %), as NVML would show it.
    await page
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) })
      .locator('.jp-LauncherCard', { hasText: 'Python 3 (¼ GPU)' })
      .click();
    await page.waitForSelector('.jp-NotebookPanel');
    const status = page.locator('.jp-gpupool-status');
    await expect(status).toHaveText('GPU ¼ · 0 % busy', { timeout: 60000 });
    await expect(status).toHaveAttribute('aria-label', /kept 0 % of the share busy over the last minute/);

    // The notebook's work keeps 37 % of its share busy: the status bar's last-minute mean climbs to it.
    await page.notebook.setCell(0, 'code', 'import gpupool\nprint(gpupool.sim_use(busy=0.37))');
    await page.notebook.runCell(0);
    await expect(page.locator('.jp-OutputArea-output').first()).toContainText('True');
    await expect(status).toHaveText(/^GPU ¼ · [1-9]\d? % busy$/, { timeout: 30000 });
    await expect(status).toHaveText('GPU ¼ · 37 % busy', { timeout: 100000 });

    // The panel: a chart per project of what it held, used, idle and not measured, and the idle job flagged.
    await page.evaluate(async () => {
      await (window as any).jupyterapp.commands.execute('gpupool:open-panel');
    });
    const panel = page.locator('#jp-gpupool-panel');
    await expect(panel).toBeVisible();
    const use = panel.locator('.jp-gpupool-use');
    const vision = use.locator('.jp-gpupool-use-figure[data-project="vision"]');
    const nlp = use.locator('.jp-gpupool-use-figure[data-project="nlp"]');
    await expect(vision.locator('svg')).toHaveAttribute('aria-label', /^vision: allocated vs used GPUs from/);
    await expect(vision.locator('[data-band="used"]')).toHaveCount(1);
    await expect(vision.locator('.jp-gpupool-use-totals')).toContainText(/GPU-h held · [\d.<]+ used \(\d+ % of measured\)/);
    await expect(nlp.locator('[data-band="idle"]')).toHaveCount(1);
    await expect(nlp.locator('[data-band="used"]')).toHaveCount(0); // held, never used
    await expect(nlp.locator('.jp-gpupool-use-totals')).toContainText('(0 % of measured)');
    // Training apart from kernels: nlp ran no kernel; vision's kernels (this one, and earlier tests' on the
    // same server within the hour) are its build work.
    const kind = use.getByLabel('Kind of work in the allocated vs used charts');
    await kind.selectOption('build');
    await expect(nlp).toHaveCount(0);
    await expect(vision.locator('svg')).toHaveAttribute('aria-label', /at most [¼½¾\d.]+ GPU held/);
    await kind.selectOption('train');
    await expect(nlp.locator('svg')).toHaveAttribute('aria-label', /^nlp: allocated vs used GPUs from .* at most 1 GPU held/);
    await kind.selectOption('all');

    const idle = use.getByRole('list', { name: 'Idle allocations' });
    await expect(idle.locator(`li[data-job-id="${started[1]}"]`)).toContainText(/^⚠ idle nlp-run.* · nlp · .+ · 1 GPU since \d/);
    await expect(idle.locator(`li[data-job-id="${started[0]}"]`)).toHaveCount(0);
    const nlpRow = panel.locator(`.jp-gpupool-job[data-job-id="${started[1]}"]`);
    await expect(nlpRow).toContainText('0 % busy');
    await expect(nlpRow.locator('.jp-gpupool-flag')).toContainText('idle');
    await expect(panel.locator(`.jp-gpupool-job[data-job-id="${started[0]}"]`)).toContainText(/[1-9]\d? % busy/);

    // Collapse what is above, so the picture shows the charts next to the notebook and its status bar.
    for (const title of ['GPUs', 'Projects']) {
      await panel.locator('summary', { hasText: title }).click();
    }
    await use.scrollIntoViewIfNeeded();
    await page.screenshot({ path: path.join(SHOTS, 'allocated-vs-used.png') });
  });
});
