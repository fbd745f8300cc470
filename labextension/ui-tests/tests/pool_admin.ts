/**
 * The test server's scheduler, as its admin: what browser tests set up through
 * the scheduler's API (project rules, work that fills the pool) the way an
 * admin would with `gpupool projects` / `gpupool submit`.
 *
 * The embedded scheduler publishes its URL in a runtime file under
 * GPUPOOL_RUNTIME_DIR (run-ui-tests.sh points it into the throwaway root) and
 * keeps its admin token in its state directory (jupyter_server_test_config.py).
 */
import { expect } from '@jupyterlab/galata';
import type { APIRequestContext } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

/** The test server's scheduler (its runtime file) and admin token (its state directory). */
export function scheduler(): { url: string; token: string } {
  const root = process.env.JUPYTERLAB_GALATA_ROOT_DIR as string;
  const runtime = process.env.GPUPOOL_RUNTIME_DIR || path.join(root, '.gpupool-runtime');
  const file = fs.readdirSync(runtime).find(f => f.startsWith('scheduler-') && f.endsWith('.json'));
  if (!file) {
    throw new Error(`no scheduler runtime file in ${runtime}`);
  }
  const url = JSON.parse(fs.readFileSync(path.join(runtime, file), 'utf8')).url as string;
  const token = fs.readFileSync(path.join(root, '.gpupool-state', 'admin_token'), 'utf8').trim();
  return { url, token };
}

/** As the admin: change a project's fields (PUT /api/v1/projects/NAME); the test fails on a refusal. */
export async function setProject(request: APIRequestContext, project: string, fields: object): Promise<void> {
  const { url, token } = scheduler();
  const reply = await request.put(`${url}/api/v1/projects/${project}`, {
    headers: { Authorization: `token ${token}` },
    data: fields
  });
  expect(reply.ok(), await reply.text()).toBe(true);
}

/**
 * Shut down every kernel of the test server, through Jupyter's REST API (sessions first, then kernels
 * without one): earlier specs' notebooks may still hold GPU shares, which a test that fills the pool or
 * watches for idle kernels must not meet.
 */
export async function shutdownEveryKernel(request: APIRequestContext): Promise<void> {
  for (const session of (await (await request.get('/api/sessions')).json()) as { id: string }[]) {
    await request.delete(`/api/sessions/${session.id}`);
  }
  for (const kernel of (await (await request.get('/api/kernels')).json()) as { id: string }[]) {
    await request.delete(`/api/kernels/${kernel.id}`);
  }
}
