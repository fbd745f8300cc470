/**
 * The GPU Pool panel's pool section: every GPU of the pool with its shares, one bar per GPU coloured by
 * project. Pure rendering from the scheduler's status (the panel decides when to re-render).
 */
import { IGpu, IStatus } from './api';
import { projectColor } from './chart';
import { h } from './dom';
import { formatBytes, formatGpus } from './format';

/** The section's content: a list of GPUs, or a note when the pool has none. */
export function poolView(status: IStatus): HTMLElement {
  const names = status.projects.map(p => p.name);
  const nodes = status.pool.nodes ?? [];
  if (nodes.every(n => n.gpus.length === 0)) {
    return h('p', { class: 'jp-gpupool-empty' }, 'No GPUs in the pool.');
  }
  const list = h('ul', { class: 'jp-gpupool-gpus', 'aria-label': 'Pool GPUs' });
  for (const node of nodes) {
    for (const gpu of node.gpus) {
      list.appendChild(gpuRow(node.name, nodes.length > 1, gpu, names));
    }
  }
  return list;
}

/** One GPU: its shares as a bar, what it holds and, where measured, how busy it is. */
function gpuRow(nodeName: string, showNode: boolean, gpu: IGpu, names: string[]): HTMLElement {
  const bar = h('div', { class: 'jp-gpupool-bar', 'aria-hidden': 'true' });
  for (const a of gpu.allocations ?? []) {
    const seg = h('span', {
      class: `jp-gpupool-seg jp-gpupool-seg-${a.kind}`,
      style: `width:${Math.min(100, a.fraction * 100)}%;background:${projectColor(a.project, names)}`,
      title: `${a.job_id}: ${a.project}/${a.user} ${a.kind === 'build' ? 'kernel' : 'training'} ${formatGpus(a.fraction)} GPU`
    });
    bar.appendChild(seg);
  }
  const measured: string[] = [];
  if (typeof gpu.utilization === 'number') {
    measured.push(`${Math.round(gpu.utilization)}% busy`);
  }
  if (typeof gpu.memory_used === 'number') {
    measured.push(`${formatBytes(gpu.memory_used)} used`);
  }
  const who = (gpu.allocations ?? []).map(a => `${a.project} ${formatGpus(a.fraction)}`).join(', ');
  const label =
    `GPU ${gpu.index} ${gpu.model}: ${formatGpus(gpu.allocated)} of 1 allocated` +
    (who ? ` (${who})` : '') +
    `, memory ${formatBytes(gpu.memory)}` +
    (measured.length ? `, ${measured.join(', ')}` : '');
  return h(
    'li',
    { class: 'jp-gpupool-gpu', 'aria-label': label, 'data-gpu': gpu.id },
    h(
      'div',
      { class: 'jp-gpupool-gpu-title' },
      h('span', {}, `${showNode ? `${nodeName} · ` : ''}GPU ${gpu.index} · ${gpu.model}`),
      h('span', { class: 'jp-gpupool-help' }, `${formatGpus(gpu.allocated)}/1`)
    ),
    bar,
    h('div', { class: 'jp-gpupool-help' }, `${formatBytes(gpu.memory)}${measured.length ? ' · ' + measured.join(' · ') : ''}`)
  );
}
