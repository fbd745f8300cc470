/**
 * How a gang job (N replicas × G GPUs, issue 12) reads in the panel: where each
 * replica runs. Kept apart from panel.ts, which lays out the sections; the
 * wording comes from format.ts so the row, the detail and the tests agree.
 */
import type { IJob } from './api';
import { h } from './dom';
import { formatGpuAmount, formatReplicas, jobNodes } from './format';

/** Whether the job is a gang (more than one replica). */
export function isGang(job: IJob): boolean {
  return (job.request?.replicas ?? 1) > 1;
}

/** The row's suffix for a placed gang: " · on node-a, node-b", else ''. */
export function gangWhere(job: IJob): string {
  if (!isGang(job) || !(job.assignment?.replicas ?? []).length) {
    return '';
  }
  return ` · on ${jobNodes(job)}`;
}

/** The detail's GPUs line of a gang: "16 GPUs on node-a, node-b (each replica below)". */
export function gangGpus(job: IJob, final: boolean): string {
  const count = (job.assignment?.gpus ?? []).length;
  if (count === 0) {
    return final ? '–' : 'none yet';
  }
  return `${formatGpuAmount(count)} on ${jobNodes(job)} (each replica below)`;
}

/**
 * The detail's replica list, one item per replica with its node and GPUs
 * ("replica 1 on node-b: GPUs 0–7 (A100-80GB)"); "not placed yet" for a gang
 * that waits, null for a one-replica job.
 */
export function replicaList(job: IJob, final: boolean): HTMLElement | null {
  if (!isGang(job)) {
    return null;
  }
  const lines = formatReplicas(job);
  if (lines.length === 0) {
    return h('span', {}, final ? '–' : `${job.request.replicas} replicas, not placed yet`);
  }
  return h(
    'ul',
    { class: 'jp-gpupool-replicas', 'aria-label': `Replicas of job ${job.id}` },
    ...lines.map((line, rank) => h('li', { 'data-rank': rank }, line))
  );
}
