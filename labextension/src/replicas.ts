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
 * ("replica 1 on node-b: GPUs 0–7 (A100-80GB)") and, for a promoted notebook,
 * a button opening that rank's output notebook (rank 0's is the job's own
 * "Open output notebook"); "not placed yet" for a gang that waits, null for a
 * one-replica job.
 */
export function replicaList(job: IJob, final: boolean, openPath: (path: string) => void): HTMLElement | null {
  if (!isGang(job)) {
    return null;
  }
  const outputs = job.replica_output_notebooks ?? [];
  let lines = formatReplicas(job);
  if (lines.length === 0) {
    if (!final || outputs.length === 0) {
      return h('span', {}, final ? '–' : `${job.request.replicas} replicas, not placed yet`);
    }
    // A finished gang holds no GPUs any more; its replicas' notebooks are still there to open.
    lines = outputs.map((_, rank) => `replica ${rank}`);
  }
  return h(
    'ul',
    { class: 'jp-gpupool-replicas', 'aria-label': `Replicas of job ${job.id}` },
    ...lines.map((line, rank) => {
      // Rank 0's notebook is the job's output (its own button below); the others' open from here.
      const out = rank > 0 ? outputs[rank] : undefined;
      return h(
        'li',
        { 'data-rank': rank },
        h('span', { class: 'jp-gpupool-replica-where' }, line),
        out ? ' ' : null,
        out
          ? h(
              'button',
              {
                class: 'jp-gpupool-button jp-gpupool-replica-output',
                type: 'button',
                'aria-label': `Open replica ${rank}'s output notebook ${out}`,
                title: out,
                onclick: () => openPath(out)
              },
              'Open output'
            )
          : null
      );
    })
  );
}

/**
 * The detail's choice of log for a gang: every replica's lines (each prefixed
 * "[K] ") or replica K's alone. `onChange` gets null for all, else the rank.
 */
export function logPicker(job: IJob, current: number | null, onChange: (replica: number | null) => void): HTMLElement {
  const select = h(
    'select',
    { class: 'jp-gpupool-log-replica', 'aria-label': `Log of job ${job.id}` },
    h('option', { value: '', selected: current === null }, 'All replicas'),
    ...Array.from({ length: job.request.replicas ?? 1 }, (_, rank) =>
      h('option', { value: String(rank), selected: current === rank }, `Replica ${rank}`)
    )
  );
  select.addEventListener('change', () => onChange(select.value === '' ? null : Number(select.value)));
  return h('label', { class: 'jp-gpupool-help' }, 'Log of ', select);
}
