/**
 * A GPU kernel waiting for room says so in its notebook (issue 25, item 2).
 *
 * Training work of a project guaranteed the whole pool ("research", made by the
 * admin for this test) fills the four simulated GPUs: nothing there is
 * borrowed, so nothing is taken back for a kernel, and a new
 * "Python 3 (¼ GPU)" notebook's share queues. Lab shows the kernel as
 * starting; the status bar says "GPU ¼ · waiting for a share", with the
 * scheduler's reason and when the start gives up in its tooltip. When one
 * training job ends, the kernel starts on its share and the status bar shows
 * the share as usual.
 */
import { expect, test } from '@jupyterlab/galata';
import type { APIRequestContext } from '@playwright/test';

import { scheduler, setProject, shutdownEveryKernel } from './pool_admin';

/** As the admin: a project guaranteed `gpus` GPUs of training. */
async function guarantee(request: APIRequestContext, project: string, gpus: number): Promise<void> {
  await setProject(request, project, { train_guarantee: gpus });
}

/** As the admin: a training job of `project` that holds `gpus` GPUs for a while. */
async function holdGpus(request: APIRequestContext, project: string, gpus: number): Promise<string> {
  const { url, token } = scheduler();
  const reply = await request.post(`${url}/api/v1/jobs`, {
    headers: { Authorization: `token ${token}` },
    data: { project, gpus, name: `${project}-holds-${gpus}`, command: ['sleep', '300'] }
  });
  expect(reply.ok(), await reply.text()).toBe(true);
  return (await reply.json()).id as string;
}

async function jobState(request: APIRequestContext, id: string): Promise<string> {
  const { url, token } = scheduler();
  const reply = await request.get(`${url}/api/v1/jobs/${id}`, { headers: { Authorization: `token ${token}` } });
  return (await reply.json()).state as string;
}

async function cancel(request: APIRequestContext, id: string): Promise<void> {
  const { url, token } = scheduler();
  await request.post(`${url}/api/v1/jobs/${id}/cancel`, { headers: { Authorization: `token ${token}` } });
}

// Galata's kernel mock also catches /gpupool/api/kernels: off, as in gpupool.spec.ts.
test.use({ autoGoto: true, kernels: null });

test.describe('a kernel waiting for its share', () => {
  const holding: string[] = [];

  test.beforeEach(async ({ page }) => {
    await shutdownEveryKernel(page.request); // the whole pool free for the training work below
  });

  test.afterEach(async ({ page }) => {
    for (const id of holding.splice(0)) {
      await cancel(page.request, id);
    }
    await guarantee(page.request, 'research', 0);
    await page.evaluate(async () => {
      await (window as any).jupyterapp.serviceManager.sessions.shutdownAll();
    });
  });

  test('says why in the status bar until it starts', async ({ page }) => {
    test.setTimeout(180000);
    await guarantee(page.request, 'research', 4);
    holding.push(await holdGpus(page.request, 'research', 2), await holdGpus(page.request, 'research', 2));
    await expect
      .poll(async () => Promise.all(holding.map(id => jobState(page.request, id))), { timeout: 30000 })
      .toEqual(['running', 'running']);

    await page
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) })
      .locator('.jp-LauncherCard', { hasText: 'Python 3 (¼ GPU)' })
      .click();
    await page.waitForSelector('.jp-NotebookPanel');
    const status = page.locator('.jp-gpupool-status');
    await expect(status).toHaveText('GPU ¼ · waiting for a share', { timeout: 30000 });
    await expect(status).toHaveAttribute('data-starting', 'share');
    await expect(status).toHaveAttribute('aria-label', /^The kernel waits for room for its GPU share: .+\. It gives up at \d/);

    // Room again: the kernel starts on its share, and the status bar shows the share itself.
    await cancel(page.request, holding[1]);
    await expect(status).toHaveText(/^GPU ¼( · |$)/, { timeout: 60000 });
    await expect(status).not.toHaveText(/waiting/);
    await expect(status).not.toHaveAttribute('data-starting', /.*/);
  });
});
