/**
 * Idle GPU kernels in the browser (issue 26, item 4): a ¼ GPU notebook whose
 * GPU goes idle is warned in Lab's notifications, and, once its server has
 * shut the kernel down, told so; its share is back in the pool.
 *
 * The admin gives the demo project a 2 s idle window for kernels (through the
 * scheduler's API with the admin token of the test server's state, as an admin
 * would with `gpupool projects`); the test server gives a 4 s notice
 * (jupyter_server_test_config.py). The window goes back to the default at the end.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import type { APIRequestContext } from '@playwright/test';
import * as path from 'path';

import { setProject, shutdownEveryKernel } from './pool_admin';

async function setKernelIdleRule(request: APIRequestContext, idle: unknown): Promise<void> {
  await setProject(request, 'vision', { idle });
}

async function shutdownAllKernels(page: IJupyterLabPageFixture): Promise<void> {
  await page.evaluate(async () => {
    await (window as any).jupyterapp.serviceManager.sessions.shutdownAll();
  });
}

// Galata's kernel mock also catches /gpupool/api/kernels: off, as in gpupool.spec.ts.
test.use({ autoGoto: true, kernels: null });

test.describe('idle GPU kernels', () => {
  test.beforeEach(async ({ page }) => {
    await shutdownEveryKernel(page.request); // only this test's kernel may be flagged idle
  });

  test.afterEach(async ({ page }) => {
    await setKernelIdleRule(page.request, null);
    await shutdownAllKernels(page);
  });

  test('an idle ¼ GPU kernel is warned, then shut down, in Lab notifications', async ({ page }) => {
    await page
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) })
      .locator('.jp-LauncherCard', { hasText: 'Python 3 (¼ GPU)' })
      .click();
    await page.waitForSelector('.jp-NotebookPanel');
    await expect(page.locator('.jp-gpupool-status')).toContainText('GPU ¼', { timeout: 60000 });
    // The notebook says its GPU is idle (on simulated GPUs the work reports its own use).
    await page.notebook.setCell(0, 'code', 'import gpupool\nprint(gpupool.sim_use(busy=0.0))');
    await page.notebook.runCell(0);
    await expect(page.locator('.jp-OutputArea-output').first()).toContainText('True');
    // The admin's 2 s window, once the cell has run: Galata's runCell waits for a status bar item whose
    // text is "Idle", and an idle share's status bar item says "idle" too.
    await setKernelIdleRule(page.request, { build: { window_s: 2 } });

    const warning = page.locator('.Toastify__toast', { hasText: 'its GPU share has been idle since' });
    await expect(warning).toBeVisible({ timeout: 30000 });
    await expect(warning).toContainText(/Kernel Untitled\d*\.ipynb/);
    await expect(warning).toContainText('will shut the kernel down shortly');
    await page.screenshot({ path: path.join(__dirname, '..', 'screenshots', 'idle-warning.png') });

    const culled = page.locator('.Toastify__toast', { hasText: 'was shut down: its GPU share had been idle' });
    await expect(culled).toBeVisible({ timeout: 30000 });
    await expect(culled).toContainText('is back in the pool');
    await expect(warning).toHaveCount(0); // the standing warning is gone with it
    // The share is back: no kernel share of ours in the pool.
    const jobs = await (await page.request.get('/gpupool/api/jobs?mine=1')).json();
    expect(jobs.filter((j: any) => j.kind === 'build' && j.state === 'running')).toEqual([]);
  });
});
