/**
 * Browser tests of jupyter-gpupool against a real JupyterLab server with the
 * gpupool server extension on simulated GPUs (see playwright.config.js).
 *
 * They walk what a user does: pick a ¼ GPU kernel in the Launcher and see its
 * share in the status bar; promote a notebook with parameters and follow it to
 * completion in the GPU Pool panel, then open its output notebook from there.
 * Screenshots land in ui-tests/screenshots/ (ignored by git), or in
 * $GPUPOOL_SCREENSHOTS_DIR; `scripts/screenshots` copies them into
 * docs/screenshots/ for the README.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import type { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

const SHOTS = process.env.GPUPOOL_SCREENSHOTS_DIR || path.resolve(__dirname, '..', 'screenshots');
const EXAMPLES = path.resolve(__dirname, '..', '..', '..', 'examples');

/** A notebook with a papermill `parameters` cell and a short "training" loop. */
function trainingNotebook(epochs = 3): string {
  const cell = (source: string, tags: string[] = []) => ({
    cell_type: 'code',
    execution_count: null,
    metadata: { tags },
    outputs: [],
    source
  });
  return JSON.stringify({
    cells: [
      cell(`epochs = ${epochs}\nlr = 0.1\nlabel = "baseline"`, ['parameters']),
      cell(
        'import os, time\n' +
          'for epoch in range(epochs):\n' +
          '    print(f"epoch {epoch} lr={lr}", flush=True)\n' +
          '    time.sleep(0.3)\n' +
          'print(f"done label={label} epochs={epochs} share={os.environ.get(\'GPUPOOL_GPU_FRACTION\')}")'
      )
    ],
    metadata: {
      kernelspec: { display_name: 'Python 3 (ipykernel)', language: 'python', name: 'python3' },
      language_info: { name: 'python' }
    },
    nbformat: 4,
    nbformat_minor: 5
  });
}

async function shutdownAllKernels(page: IJupyterLabPageFixture): Promise<void> {
  await page.evaluate(async () => {
    await (window as any).jupyterapp.serviceManager.sessions.shutdownAll();
  });
}

/** Activate a control from the keyboard (also where toasts cover it). */
async function press(control: Locator): Promise<void> {
  await control.focus();
  await control.press('Enter');
}

async function openPoolPanel(page: IJupyterLabPageFixture) {
  await page.evaluate(async () => {
    await (window as any).jupyterapp.commands.execute('gpupool:open-panel');
  });
  const panel = page.locator('#jp-gpupool-panel');
  await expect(panel).toBeVisible();
  return panel;
}

// Galata mocks every URL matching /api/kernels to track the test's kernels, and that
// pattern also catches /gpupool/api/kernels: turn the mock off (afterEach shuts kernels down).
test.use({ autoGoto: true, kernels: null });

test.describe('jupyter-gpupool in JupyterLab', () => {
  test.afterEach(async ({ page }) => {
    await shutdownAllKernels(page);
  });

  test('the Launcher offers the GPU kernels', async ({ page }) => {
    const launcher = page.locator('.jp-Launcher');
    await expect(launcher).toBeVisible();
    const notebookSection = launcher
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) });
    for (const label of ['Python 3 (¼ GPU)', 'Python 3 (½ GPU)', 'Python 3 (1 GPU)']) {
      await expect(notebookSection.locator('.jp-LauncherCard', { hasText: label })).toBeVisible();
    }
    // In the order of their share, smallest first (a collator alone put them 1, ½, ¼), in both sections.
    for (const section of ['Notebook', 'Console']) {
      const labels = launcher
        .locator('.jp-Launcher-section')
        .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: section }) })
        .locator('.jp-LauncherCard-label');
      await expect
        .poll(async () => (await labels.allTextContents()).filter(text => text.includes(' GPU)')))
        .toEqual(['Python 3 (¼ GPU)', 'Python 3 (½ GPU)', 'Python 3 (1 GPU)']);
    }
    await page.screenshot({ path: path.join(SHOTS, 'launcher.png') });
  });

  test('a ¼ GPU kernel starts and its share shows in the status bar', async ({ page }) => {
    const card = page
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) })
      .locator('.jp-LauncherCard', { hasText: 'Python 3 (¼ GPU)' });
    await card.click();
    await page.waitForSelector('.jp-NotebookPanel');
    await expect(page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).toHaveCount(1, {
      timeout: 60000
    });

    const status = page.locator('.jp-gpupool-status');
    await expect(status).toContainText('GPU ¼', { timeout: 30000 });
    await expect(status).toHaveAttribute('aria-label', /Kernel on ¼ GPU/);

    // The kernel itself runs with the share's environment.
    await page.notebook.setCell(0, 'code', 'import os; print(os.environ["GPUPOOL_GPU_FRACTION"])');
    await page.notebook.runCell(0);
    await expect(page.locator('.jp-OutputArea-output').first()).toContainText('0.25');

    // The pool panel shows the kernel's share on a GPU.
    const panel = await openPoolPanel(page);
    await expect(panel.locator('.jp-gpupool-gpu[aria-label*="¼ of 1 allocated"]')).toHaveCount(1);
    await page.screenshot({ path: path.join(SHOTS, 'kernel-share.png') });
  });

  test('a promoted notebook runs to completion and its output opens from the panel', async ({
    page,
    tmpPath
  }) => {
    const name = 'train.ipynb';
    await page.contents.uploadContent(trainingNotebook(), 'text', `${tmpPath}/${name}`);
    await page.notebook.openByPath(`${tmpPath}/${name}`);
    await page.notebook.activate(name);

    // The toolbar button opens the dialog, prefilled from the parameters cell.
    await page.locator('.jp-NotebookPanel-toolbar [data-jp-item-name="gpupool-promote"] button').click();
    const dialog = page.locator('.jp-Dialog');
    // The project's line reads as a sentence: "2 GPUs guaranteed for training, …" (vision's guarantee is 2).
    const project = dialog.getByLabel('Project');
    await expect(project).toHaveValue('vision');
    const projectLine = /^2 GPUs guaranteed for training, [\d¼½¾.]+ in use now; \d+ jobs? pending\.$/;
    await expect(project).toHaveAccessibleDescription(projectLine);
    await expect(dialog.getByText(projectLine)).toBeVisible();
    await expect(dialog.locator('input[data-param="epochs"]')).toHaveValue('3');
    await expect(dialog.locator('input[data-param="label"]')).toHaveValue('"baseline"');
    await dialog.locator('input[data-param="epochs"]').fill('2');
    await dialog.locator('input[name="gpus"]').fill('0.5');
    await page.screenshot({ path: path.join(SHOTS, 'promote-dialog.png') });
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();

    // Submitting shows a notification with a link to the job.
    const toast = page.locator('.Toastify__toast', { hasText: `Promoted ${name}` });
    await expect(toast).toBeVisible();
    await toast.getByRole('button', { name: 'Show job' }).click();

    // The panel follows the job to completion.
    const panel = page.locator('#jp-gpupool-panel');
    await expect(panel).toBeVisible();
    const detail = panel.locator('.jp-gpupool-detail');
    await expect(detail).toBeVisible();
    await expect(detail.locator('dd').first()).toContainText('succeeded', { timeout: 120000 });
    await expect(detail.locator('.jp-gpupool-log')).toContainText('epoch 1', { timeout: 30000 });
    const row = panel.locator('.jp-gpupool-job.jp-mod-selected');
    await expect(row).toHaveAttribute('data-state', 'succeeded');

    // A later notification says it finished, with a link to the output notebook.
    await expect(page.locator('.Toastify__toast', { hasText: 'finished' })).toBeVisible({ timeout: 30000 });
    await page.screenshot({ path: path.join(SHOTS, 'panel-job-done.png') });

    // Open the output notebook from the panel: it holds the run's output with the new parameter.
    await detail.locator('.jp-gpupool-open-output').click();
    const output = page.locator('.jp-NotebookPanel:visible .jp-OutputArea-output', {
      hasText: 'done label=baseline epochs=2 share=0.5'
    });
    await expect(output).toBeVisible({ timeout: 30000 });
    await expect(page.locator('.lm-TabBar-tab.jp-mod-current', { hasText: 'output.ipynb' })).toBeVisible();
    await page.screenshot({ path: path.join(SHOTS, 'output-notebook.png') });
  });

  test('the tour notebook builds on ¼ GPU, promotes and monitors', async ({ page, tmpPath }) => {
    for (const name of ['gpupool-tour.ipynb', 'gpupool-tour-train.ipynb']) {
      const text = fs.readFileSync(path.join(EXAMPLES, name), 'utf-8');
      await page.contents.uploadContent(text, 'text', `${tmpPath}/${name}`);
    }
    await page.notebook.openByPath(`${tmpPath}/gpupool-tour.ipynb`);
    await page.notebook.activate('gpupool-tour.ipynb');
    await expect(page.locator('.jp-gpupool-status')).toContainText('GPU ¼', { timeout: 60000 });

    // Cells: 0 md, 1 md, 2 env, 3 %gpupool status, 4 md, 5 experiment, 6 md, 7 promote, 8 md,
    // 9 PoolMonitor, 10 QueueMonitor.
    const cell = (i: number) => page.locator('.jp-Notebook .jp-Cell').nth(i);
    const output = (i: number) => cell(i).locator('.jp-OutputArea');
    for (const i of [2, 3, 5, 7, 9, 10]) {
      await page.notebook.runCell(i);
    }
    await expect(output(2)).toContainText("'GPUPOOL_GPU_FRACTION': '0.25'");
    await expect(output(3)).toContainText('simulated GPUs');
    await expect(output(5)).toContainText('step 4: loss');
    const promoted = /promoted gpupool-tour-train.ipynb as job (j-\d+)/;
    await expect(output(7)).toContainText(promoted);
    const jobId = promoted.exec((await output(7).textContent()) ?? '')?.[1] ?? '';
    expect(jobId).toMatch(/^j-\d+$/);

    // The widgets render their rows a moment after their box appears: wait for the rows a
    // user reads. PoolMonitor: a row per GPU of the demo pool (4 A100s), the tour's ¼ share
    // on one of them, and a row per project with its build and training use.
    const pool = output(9);
    const gpuRows = pool.locator('.widget-hbox', { hasText: /GPU\d A100/ });
    await expect(gpuRows).toHaveCount(4);
    await expect(gpuRows.filter({ hasText: /vision\/\S+ build ¼/ })).toHaveCount(1);
    for (const project of ['vision', 'nlp']) {
      const row = pool.locator('.widget-hbox', { has: page.locator('b', { hasText: new RegExp(`^${project}$`) }) });
      await expect(row).toHaveCount(1);
      await expect(row).toContainText(/build [\d.]+ \/ .*train [\d.]+ \/ /);
    }
    // QueueMonitor: the promoted job's row, with the buttons to act on it.
    const queueRow = output(10).locator('.widget-hbox', { hasText: jobId });
    await expect(queueRow).toContainText('gpupool-tour-train');
    await expect(queueRow).toContainText(/queued|running/);
    for (const name of ['pause', 'cancel']) {
      const button = queueRow.getByRole('button', { name });
      await expect(button).toBeVisible();
      // Its label reads whole (not cut to "p…" by the row's long text).
      await expect.poll(() => button.evaluate(b => b.scrollWidth <= b.clientWidth)).toBe(true);
    }
    await expect(page.locator('.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')).toHaveCount(0);
    // Both monitors in the picture: the PoolMonitor's cell at the top of the notebook.
    await cell(9).evaluate(node => node.scrollIntoView({ block: 'start' }));
    await expect(queueRow).toBeInViewport();
    await page.screenshot({ path: path.join(SHOTS, 'tour.png') });

    // The promoted run trains to the end and checkpoints on the way.
    const panel = await openPoolPanel(page);
    const job = panel.locator('.jp-gpupool-job', { hasText: 'gpupool-tour-train' }).first();
    await expect(job).toHaveAttribute('data-state', 'succeeded', { timeout: 120000 });
  });

  test('a failing run is announced with a link to its output notebook', async ({ page, tmpPath }) => {
    const nb = JSON.parse(trainingNotebook());
    nb.cells.push({ cell_type: 'code', execution_count: null, metadata: {}, outputs: [], source: 'raise RuntimeError("diverged")' });
    await page.contents.uploadContent(JSON.stringify(nb), 'text', `${tmpPath}/bad.ipynb`);
    const reply = await page.request.post('/gpupool/api/promote', { data: { path: `${tmpPath}/bad.ipynb` } });
    expect(reply.status()).toBe(201);
    const id = (await reply.json()).id as string;

    const toast = page.locator('.Toastify__toast', { hasText: `Job ${id}` }).filter({ hasText: 'failed' });
    await expect(toast).toBeVisible({ timeout: 120000 });
    await press(toast.getByRole('button', { name: 'Open output notebook' }));
    await expect(
      page.locator('.jp-NotebookPanel:visible .jp-OutputArea-output', { hasText: 'RuntimeError: diverged' }).first()
    ).toBeVisible({ timeout: 30000 });
  });

  test('pause, resume and cancel an own job from the panel, with notifications', async ({ page, tmpPath }) => {
    await page.contents.uploadContent(trainingNotebook(400), 'text', `${tmpPath}/long.ipynb`);
    const reply = await page.request.post('/gpupool/api/promote', {
      data: { path: `${tmpPath}/long.ipynb`, gpus: 1 }
    });
    expect(reply.status()).toBe(201);
    const id = (await reply.json()).id as string;

    const panel = await openPoolPanel(page);
    const row = panel.locator(`.jp-gpupool-job[data-job-id="${id}"]`);
    await expect(row).toHaveAttribute('data-state', 'running', { timeout: 60000 });

    await press(row.getByRole('button', { name: `Pause job ${id}` }));
    await expect(row).toHaveAttribute('data-state', 'paused', { timeout: 30000 });
    await expect(page.locator('.Toastify__toast', { hasText: `Job ${id}` }).filter({ hasText: 'was paused' })).toBeVisible();
    // The projects table counts the paused job apart, as `gpupool status` does, not as pending.
    const project = panel.locator('tr[data-project="vision"] th');
    await expect(project).toContainText('1 paused', { timeout: 30000 });
    await expect(project).not.toContainText('pending');

    await press(row.getByRole('button', { name: `Resume job ${id}` }));
    await expect(page.locator('.Toastify__toast', { hasText: `Job ${id}` }).filter({ hasText: 'resumed' })).toBeVisible({
      timeout: 60000
    });
    await expect(row).toHaveAttribute('data-state', 'running');

    await press(row.getByRole('button', { name: `Cancel job ${id}` }));
    await expect(row).toHaveAttribute('data-state', 'cancelled', { timeout: 30000 });
    await expect(row.getByRole('button', { name: `Cancel job ${id}` })).toHaveCount(0);
  });

  test('a job running before Lab opened and paused after is announced only as paused', async ({ page, tmpPath }) => {
    await page.contents.uploadContent(trainingNotebook(400), 'text', `${tmpPath}/before.ipynb`);
    const reply = await page.request.post('/gpupool/api/promote', { data: { path: `${tmpPath}/before.ipynb`, gpus: 1 } });
    expect(reply.status()).toBe(201);
    const id = (await reply.json()).id as string;
    await expect
      .poll(async () => (await (await page.request.get(`/gpupool/api/jobs/${id}`)).json()).state, { timeout: 60000 })
      .toBe('running');

    // Lab opens now, with the job already running; the pause comes once its event stream polls.
    const polling = page.waitForRequest(/\/gpupool\/api\/events\?since=\d+&timeout=25/, { timeout: 60000 });
    await page.goto();
    await polling;
    expect((await page.request.post(`/gpupool/api/jobs/${id}/pause`)).ok()).toBe(true);

    const toasts = page.locator('.Toastify__toast', { hasText: `Job ${id}` });
    await expect(toasts.filter({ hasText: 'was paused' })).toBeVisible({ timeout: 30000 });
    // Toasts appear asynchronously: once a later event's toast is in, every earlier one is too.
    expect((await page.request.post(`/gpupool/api/jobs/${id}/cancel`)).ok()).toBe(true);
    await expect(toasts.filter({ hasText: 'was cancelled' })).toBeVisible({ timeout: 30000 });
    // The pause began with a `running` event carrying its reason: no "started" or "resumed" from it.
    // (Read once: a retrying assertion would wait for such a toast to close by itself.)
    const texts = await toasts.allTextContents();
    expect(texts.filter(text => /started|resumed/.test(text))).toEqual([]);
    expect(texts).toHaveLength(2);
  });

  test('the promote dialog does not submit a request no node can hold', async ({ page, tmpPath }) => {
    await page.contents.uploadContent(trainingNotebook(), 'text', `${tmpPath}/big8.ipynb`);
    await page.notebook.openByPath(`${tmpPath}/big8.ipynb`);
    await page.notebook.activate('big8.ipynb');
    await page.locator('.jp-NotebookPanel-toolbar [data-jp-item-name="gpupool-promote"] button').click();
    const dialog = page.locator('.jp-Dialog');
    const gpus = dialog.locator('input[name="gpus"]');
    const promote = dialog.locator('.jp-Dialog-button.jp-mod-accept');
    await expect(promote).toBeEnabled();

    // The demo pool is one node of 4 GPUs: 8 cannot run anywhere, and the dialog says why.
    await gpus.fill('8');
    const reason = dialog.getByRole('alert');
    await expect(reason).toHaveText(
      'Cannot promote: No node of the pool has 8 GPUs (the largest has 4 GPUs): ask for at most 4.'
    );
    await expect(gpus).toHaveAccessibleDescription(/No node of the pool has 8 GPUs/);
    await expect(promote).toBeDisabled();
    await page.screenshot({ path: path.join(SHOTS, 'promote-too-big.png') });

    // Enter in the field (which submits a dialog) is refused too: the dialog comes back with the reason.
    const before = (await (await page.request.get('/gpupool/api/jobs?mine=1')).json()).length;
    await gpus.press('Enter');
    await expect(dialog.locator('.jp-gpupool-error[role="alert"]').first()).toContainText('No node of the pool has 8 GPUs');
    expect((await (await page.request.get('/gpupool/api/jobs?mine=1')).json()).length).toBe(before);

    // Two replicas of 2 GPUs fit on the one node; three of 2 do not.
    await dialog.locator('input[name="gpus"]').fill('2');
    await expect(dialog.locator('.jp-Dialog-button.jp-mod-accept')).toBeEnabled();
    await dialog.locator('input[name="replicas"]').fill('3');
    await expect(dialog.locator('.jp-Dialog-button.jp-mod-accept')).toBeDisabled();
    await expect(dialog.getByRole('alert').last()).toContainText("The pool's nodes hold at most 2 replicas of 2 GPUs, not 3");
    await dialog.locator('input[name="replicas"]').fill('2');
    await expect(dialog.locator('.jp-Dialog-button.jp-mod-accept')).toBeEnabled();
    await dialog.locator('.jp-Dialog-button.jp-mod-reject').click();
  });

  test('training beyond the guarantee shows as over quota in the projects table', async ({ page, tmpPath }) => {
    await page.contents.uploadContent(trainingNotebook(400), 'text', `${tmpPath}/big.ipynb`);
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) {
      const reply = await page.request.post('/gpupool/api/promote', { data: { path: `${tmpPath}/big.ipynb`, gpus: 2 } });
      expect(reply.status()).toBe(201);
      ids.push((await reply.json()).id);
    }
    const panel = await openPoolPanel(page);
    const training = panel.locator('tr[data-project="vision"] td').nth(1);
    // vision's guarantee is 2 GPUs: the second 2-GPU job runs on idle GPUs beyond it.
    await expect(training).toContainText('4/2', { timeout: 60000 });
    await expect(training).toContainText('+2 over');
    await expect(training).toHaveClass(/jp-mod-over/);
    await expect(training).toHaveAttribute('title', /may be paused when another project claims its share/);
    await expect(training.locator('[role="meter"]')).toHaveAttribute('aria-valuetext', '4 of 2 GPU');
    // Recent use: GPU-hours held lately and the share of the fair share they make (issue 15).
    const recent = panel.locator('tr[data-recent-of="vision"] td');
    await expect(recent).toContainText(/Recent: [\d.<]+ GPU-h, \d+% of its fair share/, { timeout: 30000 });
    await expect(recent).toHaveAttribute('title', /on average lately, of a fair share of/);
    // The history chart draws vision's shares once the scheduler has sampled them.
    await expect(panel.locator('svg.jp-gpupool-chart polygon[data-project="vision"]')).toHaveCount(1, { timeout: 40000 });
    await expect(panel.locator('svg.jp-gpupool-chart')).toHaveAttribute('aria-label', /vision 4 GPU/);
    await page.screenshot({ path: path.join(SHOTS, 'over-quota.png') });
    for (const id of ids) {
      const reply = await page.request.post(`/gpupool/api/jobs/${id}/cancel`);
      expect(reply.ok()).toBe(true);
    }
    await expect(training).toContainText('0/2', { timeout: 30000 });
  });

  test('a kernel beyond the build quota is refused with a message naming the quota, shown whole', async ({ page, tmpPath }) => {
    // Fill vision's build quota (1½ GPUs) with a 1 GPU and a ½ GPU kernel.
    for (const [name, kernel] of [
      ['one.ipynb', 'gpupool-python3-1'],
      ['half.ipynb', 'gpupool-python3-0.5']
    ]) {
      const reply = await page.request.post('/api/sessions', {
        data: { path: `${tmpPath}/${name}`, name, type: 'notebook', kernel: { name: kernel } }
      });
      expect(reply.status()).toBe(201);
    }
    const panel = await openPoolPanel(page);
    const build = panel.locator('tr[data-project="vision"] td').first();
    await expect(build).toContainText('1½/1½');
    await expect(build).toContainText('full');
    await expect(build).toHaveAttribute('title', /Build quota exhausted/);

    // A ¼ GPU kernel from the Launcher cannot start; the error says why and what to do.
    await page
      .locator('.jp-Launcher-section')
      .filter({ has: page.locator('.jp-Launcher-sectionTitle', { hasText: 'Notebook' }) })
      .locator('.jp-LauncherCard', { hasText: 'Python 3 (¼ GPU)' })
      .click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog.locator('.jp-Dialog-header')).toContainText('Error Starting Kernel', { timeout: 60000 });
    // The message says whose quota it is and names the notebooks holding it.
    const message = dialog.locator('.jp-Dialog-body pre').first();
    await expect(message).toContainText("project 'vision'");
    await expect(message).toContainText('build quota');
    await expect(message).toContainText('one.ipynb');
    await expect(message).toContainText('half.ipynb');
    // ... and says what was asked and what is left, in the Launcher's shares.
    await expect(message).toContainText('asked for ¼ GPU');
    await expect(message).toContainText('nothing free');

    // The message is one long sentence (it names both notebooks by their paths): it wraps
    // inside the dialog and reads whole, with nothing cut off at the dialog's edge (no
    // sideways scrolling, its last character inside the box).
    const layout = await message.evaluate(pre => {
      const body = pre.closest('.jp-Dialog-body') as HTMLElement;
      const box = body.getBoundingClientRect();
      const range = document.createRange();
      const text = pre.firstChild as Text;
      range.setStart(text, Math.max(text.length - 1, 0));
      range.setEnd(text, text.length);
      const last = range.getBoundingClientRect();
      const lineHeight = parseFloat(getComputedStyle(pre).lineHeight) || 16;
      return {
        chars: (pre.textContent ?? '').length,
        preOverflow: pre.scrollWidth - pre.clientWidth,
        bodyOverflow: body.scrollWidth - body.clientWidth,
        lines: Math.round(pre.getBoundingClientRect().height / lineHeight),
        lastInside: last.right <= box.right + 0.5 && last.bottom <= box.bottom + 0.5 && last.left >= box.left
      };
    });
    expect(layout.chars).toBeGreaterThan(150);
    expect(layout.preOverflow).toBeLessThanOrEqual(0);
    expect(layout.bodyOverflow).toBeLessThanOrEqual(0);
    expect(layout.lines).toBeGreaterThan(1);
    expect(layout.lastInside).toBe(true);
    await page.screenshot({ path: path.join(SHOTS, 'kernel-over-quota.png') });
    await dialog.locator('.jp-Dialog-button').first().click();
  });

  test('promote is in the command palette and the file browser context menu', async ({ page, tmpPath }) => {
    await page.contents.uploadContent(trainingNotebook(), 'text', `${tmpPath}/ctx.ipynb`);
    await page.filebrowser.refresh();
    await page.locator('.jp-DirListing-item[data-file-type="notebook"]', { hasText: 'ctx.ipynb' }).click({
      button: 'right'
    });
    const item = page.locator('.lm-Menu-item', { hasText: 'Promote to Training…' });
    await expect(item).toBeVisible();
    await item.click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Promote ctx.ipynb to training');
    await dialog.locator('.jp-Dialog-button.jp-mod-reject').click();

    // The palette entry acts on the current notebook.
    await page.notebook.openByPath(`${tmpPath}/ctx.ipynb`);
    await page.notebook.activate('ctx.ipynb');
    await expect
      .poll(() => page.evaluate(() => (window as any).jupyterapp.commands.isEnabled('gpupool:promote')))
      .toBe(true);
    // The modal palette closes when it loses focus (the notebook may still be taking it): retry.
    const entry = page.locator('#modal-command-palette .lm-CommandPalette-item', {
      hasText: 'Promote Notebook to Training'
    });
    await expect(async () => {
      if (!(await page.locator('#modal-command-palette input').isVisible())) {
        await page.evaluate(async () => {
          await (window as any).jupyterapp.commands.execute('apputils:activate-command-palette');
        });
      }
      await page.locator('#modal-command-palette input').fill('Promote', { timeout: 2000 });
      await expect(entry).toBeVisible({ timeout: 2000 });
    }).toPass({ timeout: 30000 });
    await expect(entry).not.toHaveClass(/lm-mod-disabled/);
    await page.keyboard.press('Escape');
  });

  test('the promote dialog offers only the projects the user may submit into', async ({ page, tmpPath }) => {
    // The scheduler marks each project with `member` for the caller; 'nlp' lists other users only.
    await page.route(/\/gpupool\/api\/status/, async route => {
      const response = await route.fetch();
      const status = await response.json();
      const projects = status.projects.map((p: any) =>
        p.name === 'nlp' ? { ...p, members: ['someone'], member: false } : { ...p, member: true }
      );
      await route.fulfill({ response, json: { ...status, projects } });
    });
    await page.contents.uploadContent(trainingNotebook(), 'text', `${tmpPath}/members.ipynb`);
    await page.filebrowser.refresh();
    await page.locator('.jp-DirListing-item[data-file-type="notebook"]', { hasText: 'members.ipynb' }).click({
      button: 'right'
    });
    await page.locator('.lm-Menu-item', { hasText: 'Promote to Training…' }).click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Promote members.ipynb to training');
    await expect(dialog.locator('select[name="project"] option')).toHaveText(['vision']);
    await dialog.locator('.jp-Dialog-button.jp-mod-reject').click();
    await page.unroute(/\/gpupool\/api\/status/);
  });

  test('a long queue is shown in serving order and summarized past 100 rows', async ({ page }) => {
    const job = (i: number, state: string, priority: number) => ({
      id: `j-${String(i).padStart(6, '0')}`, name: `sweep ${i}`, project: 'vision', user: 'someone', kind: 'train', state,
      request: { gpus: 1, gpu_fraction: null, gpu_memory: null, gpu_model: null, cpu: null, memory: null },
      priority, submitted_at: 1000 + i, started_at: null, finished_at: null, attempts: 0, preemptible: false,
      reason: 'waiting for a GPU', assignment: null, exit_code: null, workdir: null, command: null, labels: {},
      lease_expires_at: null
    }); // prettier-ignore
    const jobs = [job(1, 'running', 0), ...Array.from({ length: 1200 }, (_, i) => job(i + 2, 'queued', i === 500 ? 5 : 0))];
    await page.route(/\/gpupool\/api\/jobs(\?|$)/, route =>
      route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(jobs.reverse()) })
    );
    const panel = await openPoolPanel(page);
    const rows = panel.locator('.jp-gpupool-job');
    await expect(rows).toHaveCount(100);
    await expect(rows.nth(0)).toHaveAttribute('data-state', 'running');
    await expect(rows.nth(1)).toHaveAttribute('data-job-id', 'j-000502'); // priority 5 is served first
    await expect(rows.nth(2)).toHaveAttribute('data-job-id', 'j-000002');
    await expect(panel.locator('.jp-gpupool-queue')).toContainText('and 1101 more live jobs');
    // Another user's job: the embedded scheduler's user is an admin, who may act on any job.
    await expect(rows.nth(1).getByRole('button', { name: 'Cancel job j-000502' })).toBeVisible();
    await page.unroute(/\/gpupool\/api\/jobs(\?|$)/);
  });

  test('a non-admin sees no quota editing and controls only their own jobs', async ({ page }) => {
    await page.route(/\/gpupool\/api\/status/, async route => {
      const response = await route.fetch();
      const status = await response.json();
      await route.fulfill({ response, json: { ...status, admin: false } });
    });
    const job = (id: string, user: string) => ({
      id, name: id, project: 'vision', user, kind: 'train', state: 'running',
      request: { gpus: 1, gpu_fraction: null, gpu_memory: null, gpu_model: null, cpu: null, memory: null },
      priority: 0, submitted_at: 1, started_at: 2, finished_at: null, attempts: 1, preemptible: true, reason: '',
      assignment: null, exit_code: null, workdir: null, command: null, labels: {}, lease_expires_at: null
    }); // prettier-ignore
    await page.route(/\/gpupool\/api\/jobs(\?|$)/, route =>
      route.fulfill({ status: 200, json: [job('j-000101', 'someone'), job('j-000100', 'root')] })
    );
    const panel = await openPoolPanel(page);
    await expect(panel.locator('.jp-gpupool-job')).toHaveCount(2);
    await expect(panel.getByRole('button', { name: /Edit quotas/ })).toHaveCount(0);
    await expect(panel.getByRole('button', { name: 'Add a project' })).toHaveCount(0);
    await expect(panel.getByRole('button', { name: 'Pause job j-000100' })).toBeVisible();
    await expect(panel.getByRole('button', { name: /job j-000101$/ })).toHaveCount(0);
    await page.unroute(/\/gpupool\/api\/jobs(\?|$)/);
    await page.unroute(/\/gpupool\/api\/status/);
  });

  test('an admin edits a project quota from the panel', async ({ page }) => {
    const panel = await openPoolPanel(page);
    const row = panel.locator('tr[data-project="vision"]');
    await expect(row).toBeVisible();
    await row.getByRole('button', { name: 'Edit quotas of project vision' }).click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog.locator('input[name="build_quota"]')).toHaveValue('1.5');
    await dialog.locator('input[name="build_quota"]').fill('2');
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();
    await expect(row.locator('td').first()).toContainText('/2');
  });

  test('the panel says so when the scheduler is unreachable, in the dark theme too', async ({ page }) => {
    await page.theme.setDarkTheme();
    // The theme's stylesheet loads after the switch: wait until the shell is actually dark.
    await expect
      .poll(() =>
        page.evaluate(() => {
          const rgb = getComputedStyle(document.querySelector('#jp-top-panel') as Element).backgroundColor;
          const [r, g, b] = (rgb.match(/\d+/g) ?? ['255', '255', '255']).map(Number);
          return r + g + b;
        })
      )
      .toBeLessThan(200);
    const panel = await openPoolPanel(page);
    await expect(panel.locator('.jp-gpupool-gpu').first()).toBeVisible();
    await expect(panel.locator('svg.jp-gpupool-chart')).toBeVisible();
    await page.screenshot({ path: path.join(SHOTS, 'panel-dark.png') });

    const statusUrl = /\/gpupool\/api\/status/;
    await page.route(statusUrl, route =>
      route.fulfill({
        status: 503,
        contentType: 'application/json',
        body: JSON.stringify({ error: 'cannot reach the scheduler at http://127.0.0.1:1: connection refused', status: 503 })
      })
    );
    await panel.getByRole('button', { name: 'Refresh the GPU pool' }).click();
    await expect(panel.locator('.jp-gpupool-banner')).toContainText('The GPU scheduler is unreachable');
    await page.unroute(statusUrl);
    await page.theme.setLightTheme();
  });
});

