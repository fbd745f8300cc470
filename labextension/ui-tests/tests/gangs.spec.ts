/**
 * A distributed notebook promoted as a 16-GPU gang (issue 12), in a browser.
 *
 * A JupyterLab of its own (gangs_server_config.py: two simulated 8-GPU nodes,
 * node-a and node-b) is started here, since the main test server simulates one
 * node. The user promotes a notebook from the file browser with 8 GPUs × 2
 * replicas; the dialog says "= 16 GPUs on 2 nodes"; the panel shows the job as
 * "2 × 8 GPUs" running on node-a and node-b, each replica's node and GPUs, all
 * 16 GPUs taken; the job's log has both replicas' lines and rank 0's output
 * notebook opens from the panel. Screenshots: gang-promote-dialog.png and
 * gang-panel.png in screenshots/ (or $GPUPOOL_SCREENSHOTS_DIR).
 */
import { expect, Page, test } from '@playwright/test';
import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';

const SHOTS = process.env.GPUPOOL_SCREENSHOTS_DIR || path.resolve(__dirname, '..', 'screenshots');
const VENV_BIN = path.resolve(__dirname, '..', '..', '..', '.venv', 'bin');
const CONFIG = path.resolve(__dirname, '..', 'gangs_server_config.py');

/** Every replica prints its rank for `steps` seconds, then where its rendezvous points. */
function distributedNotebook(steps = 6): string {
  const cell = (source: string, tags: string[] = []) => ({
    cell_type: 'code',
    execution_count: null,
    metadata: { tags },
    outputs: [],
    source
  });
  return JSON.stringify({
    cells: [
      cell(`steps = ${steps}`, ['parameters']),
      cell(
        'import os, time\n' +
          "rank, world = os.environ.get('RANK', '0'), os.environ.get('WORLD_SIZE', '1')\n" +
          'for step in range(steps):\n' +
          '    print(f"rank {rank} of {world} step {step}", flush=True)\n' +
          '    time.sleep(1)\n' +
          "gpus = len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))\n" +
          "print(f\"done rank {rank} of {world} with {gpus} GPUs, master {os.environ['MASTER_ADDR']}\")"
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

let server: ChildProcess | null = null;
let root = '';
let url = '';

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const port = (probe.address() as net.AddressInfo).port;
      probe.close(() => resolve(port));
    });
  });
}

/** Start the two-node JupyterLab and wait until it serves /lab. */
async function startServer(): Promise<void> {
  root = fs.mkdtempSync(path.join(os.tmpdir(), 'gpupool-gangs-'));
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  const jupyter = fs.existsSync(path.join(VENV_BIN, 'jupyter')) ? path.join(VENV_BIN, 'jupyter') : 'jupyter';
  const proc = spawn(jupyter, ['lab', '--config', CONFIG], {
    env: { ...process.env, GPUPOOL_UI_PORT: String(port), JUPYTERLAB_GALATA_ROOT_DIR: root },
    stdio: ['ignore', 'ignore', 'pipe']
  });
  server = proc;
  let stderr = '';
  proc.stderr!.on('data', chunk => {
    stderr = (stderr + chunk.toString()).slice(-8000);
    if (process.env.GPUPOOL_UI_DEBUG) {
      process.stderr.write(chunk);
    }
  });
  const deadline = Date.now() + 120000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) {
      throw new Error(`the two-node JupyterLab exited (${proc.exitCode}):\n${stderr}`);
    }
    try {
      const reply = await fetch(`${url}/gpupool/api/status`);
      if (reply.ok && ((await reply.json()).pool?.nodes ?? []).length === 2) {
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise(resolve => setTimeout(resolve, 500));
  }
  throw new Error(`the two-node JupyterLab did not come up in 2 minutes:\n${stderr}`);
}

async function stopServer(): Promise<void> {
  const proc = server;
  server = null;
  if (proc && proc.exitCode === null && proc.signalCode === null) {
    const exited = new Promise(resolve => proc.once('exit', resolve));
    proc.kill('SIGTERM');
    // Jupyter stops its kernels and the embedded scheduler first; a stuck stop is killed.
    const killed = setTimeout(() => proc.kill('SIGKILL'), 30000);
    await exited;
    clearTimeout(killed);
  }
  if (root) {
    fs.rmSync(root, { recursive: true, force: true });
  }
}

async function openPanel(page: Page) {
  const panel = page.locator('#jp-gpupool-panel');
  if (!(await panel.isVisible())) {
    await page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="jp-gpupool-panel"]').click();
  }
  await expect(panel).toBeVisible();
  return panel;
}

test.use({ actionTimeout: 60000, navigationTimeout: 120000 });

test.describe('multi-node gang jobs', () => {
  test.beforeAll(async () => {
    test.setTimeout(150000);
    await startServer();
  });

  test.afterAll(async () => {
    await stopServer();
  });

  test('a notebook promoted as 2 replicas × 8 GPUs runs on node-a and node-b', async ({ browser }) => {
    test.setTimeout(300000);
    fs.writeFileSync(path.join(root, 'dist.ipynb'), distributedNotebook());
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    try {
      await page.goto(`${url}/lab`);
      await expect(page.locator('.jp-Launcher')).toBeVisible({ timeout: 60000 });

      // The pool view lists both nodes' GPUs, each named by its node.
      const panel = await openPanel(page);
      const gpus = panel.locator('.jp-gpupool-gpu');
      await expect(gpus).toHaveCount(16);
      await expect(gpus.filter({ hasText: 'node-a · GPU' })).toHaveCount(8);
      await expect(gpus.filter({ hasText: 'node-b · GPU' })).toHaveCount(8);

      // Promote from the file browser: Replicas appears for whole GPUs, with the total under it.
      await page.locator('.jp-DirListing-item[data-file-type="notebook"]', { hasText: 'dist.ipynb' }).click({
        button: 'right'
      });
      await page.locator('.lm-Menu-item', { hasText: 'Promote to Training…' }).click();
      const dialog = page.locator('.jp-Dialog');
      const replicas = dialog.getByLabel('Replicas');
      await expect(replicas).toHaveValue('1');
      await dialog.locator('input[name="gpus"]').fill('0.5');
      await expect(replicas).toBeHidden();
      await dialog.locator('input[name="gpus"]').fill('8');
      await expect(replicas).toBeVisible();
      await expect(dialog.locator('.jp-gpupool-gang-total')).toHaveText('= 8 GPUs on 1 node');
      await replicas.fill('3');
      await expect(dialog.locator('.jp-gpupool-gang-total')).toHaveText(
        "= 24 GPUs: the pool's nodes hold at most 2 replicas of 8 GPUs"
      );
      await replicas.fill('2');
      await expect(dialog.locator('.jp-gpupool-gang-total')).toHaveText('= 16 GPUs on 2 nodes');
      await expect(replicas).toHaveAccessibleDescription(/^= 16 GPUs on 2 nodes For a notebook that runs distributed/);
      await page.screenshot({ path: path.join(SHOTS, 'gang-promote-dialog.png') });
      await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();

      const toast = page.locator('.Toastify__toast', { hasText: 'Promoted dist.ipynb' });
      await expect(toast).toContainText('2 × 8 GPUs');
      await toast.getByRole('button', { name: 'Show job' }).click();

      // Running: the row reads "2 × 8 GPUs" on both nodes, the detail lists each replica.
      const row = panel.locator('.jp-gpupool-job.jp-mod-selected');
      await expect(row).toHaveAttribute('data-state', 'running', { timeout: 60000 });
      await expect(row).toContainText('2 × 8 GPUs · on node-');
      // "2 × 8 GPUs · on node-a, node-b" (then, once sampled, " · 0 % busy")
      const rowNodes = (await row.locator('.jp-gpupool-help').first().innerText()).split(' · on ')[1].split(' · ')[0];
      expect(rowNodes.split(', ').sort()).toEqual(['node-a', 'node-b']);
      const detail = panel.locator('.jp-gpupool-detail');
      const items = detail.locator('.jp-gpupool-replicas li');
      await expect(items).toHaveCount(2);
      const where = (rank: number) => items.nth(rank).locator('.jp-gpupool-replica-where');
      await expect(where(0)).toHaveText(/^replica 0 on node-[ab]: GPUs 0–7 \(A100-80GB\)$/);
      await expect(where(1)).toHaveText(/^replica 1 on node-[ab]: GPUs 0–7 \(A100-80GB\)$/);
      const nodes = [await where(0).innerText(), await where(1).innerText()].map(t => t.split(' ')[3]);
      expect(nodes.sort()).toEqual(['node-a:', 'node-b:']);
      await expect(detail.locator('dd', { hasText: '16 GPUs on node-' })).toBeVisible();
      await expect(detail.locator('dt', { hasText: 'Share' }).locator('+ dd')).toHaveText('16 GPUs');
      // Every GPU of both nodes is the gang's.
      await expect(gpus.filter({ has: page.locator('.jp-gpupool-seg-train') })).toHaveCount(16);
      await expect(detail.locator('.jp-gpupool-log')).toContainText('rank 1 of 2 step', { timeout: 60000 });
      // The toasts (promoted, started) would cover the panel's detail in the picture.
      for (const close of await page.locator('.Toastify__toast .Toastify__close-button').all()) {
        await close.click().catch(() => undefined);
      }
      await detail.scrollIntoViewIfNeeded();
      await page.screenshot({ path: path.join(SHOTS, 'gang-panel.png') });

      // Done: both replicas' lines in the job's log, rank 0's notebook is the output.
      await expect(row).toHaveAttribute('data-state', 'succeeded', { timeout: 120000 });
      const log = detail.locator('.jp-gpupool-log');
      await expect(log).toContainText('done rank 0 of 2 with 8 GPUs', { timeout: 30000 });
      await expect(log).toContainText('done rank 1 of 2 with 8 GPUs');
      // One replica's log alone, and its own output notebook next to its line.
      await detail.getByLabel(/^Log of job /).selectOption({ label: 'Replica 1' });
      await expect(log).toContainText('done rank 1 of 2 with 8 GPUs');
      await expect(log).not.toContainText('rank 0 of 2');
      await expect(items.nth(1).locator('.jp-gpupool-replica-output')).toHaveAttribute('title', /output\.replica-1\.ipynb$/);
      await expect(items.nth(0).locator('.jp-gpupool-replica-output')).toHaveCount(0);
      await detail.locator('.jp-gpupool-open-output').click();
      const output = page.locator('.jp-NotebookPanel:visible .jp-OutputArea-output', {
        hasText: 'done rank 0 of 2 with 8 GPUs, master'
      });
      await expect(output).toBeVisible({ timeout: 30000 });
      expect(fs.readdirSync(path.join(root, 'dist.runs')).length).toBe(1);
      const runDir = path.join(root, 'dist.runs', fs.readdirSync(path.join(root, 'dist.runs'))[0]);
      expect(fs.readdirSync(runDir).sort()).toEqual(
        expect.arrayContaining(['input.ipynb', 'job.log', 'job.replica-1.log', 'output.ipynb', 'output.replica-1.ipynb'])
      );

      // A one-replica job on this pool of two nodes: its GPUs are named with their node.
      const single = await page.evaluate(async () => {
        const reply = await fetch('/gpupool/api/promote', {
          method: 'POST',
          headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ path: 'dist.ipynb', gpus: 2, parameters: { steps: 20 } })
        });
        return (await reply.json()).id as string;
      });
      const singleRow = panel.locator(`.jp-gpupool-job[data-job-id="${single}"]`);
      await expect(singleRow).toContainText('2 GPUs');
      await expect(singleRow).not.toContainText(' × ');
      await singleRow.locator('.jp-gpupool-job-open').click();
      await expect(detail.locator('dt', { hasText: 'GPUs' }).locator('+ dd')).toHaveText(
        /^node-[ab] · GPU \d A100-80GB ×1, node-[ab] · GPU \d A100-80GB ×1$/
      );
      await expect(detail.locator('.jp-gpupool-replicas')).toHaveCount(0);
      await expect(detail.getByLabel(/^Log of job /)).toHaveCount(0);
      await singleRow.getByRole('button', { name: `Cancel job ${single}` }).click();
      await expect(singleRow).toHaveAttribute('data-state', 'cancelled', { timeout: 30000 });
    } finally {
      await context.close();
    }
  });
});
