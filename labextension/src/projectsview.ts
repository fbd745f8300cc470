/**
 * The GPU Pool panel's projects section: each project's use against its build quota and training
 * guarantee (meters), its recent use and fair share, and the admin's edit buttons. Pure rendering from
 * the scheduler's status; editing is the caller's (``onEdit``).
 */
import { IProject, IStatus } from './api';
import { projectColor } from './chart';
import { h } from './dom';
import { formatGpus } from './format';

/** The section's content: the projects table (with edit buttons for an admin), and "Add project". */
export function projectsView(status: IStatus, onEdit: (project: IProject | null) => void): HTMLElement[] {
  const names = status.projects.map(p => p.name);
  const table = h(
    'table',
    { class: 'jp-gpupool-table', 'aria-label': 'Projects and quotas' },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Project'),
        h('th', { scope: 'col', title: 'Kernel shares used / build quota (GPUs)' }, 'Build'),
        h('th', { scope: 'col', title: 'Training GPUs used / guarantee' }, 'Training'),
        status.admin ? h('th', { scope: 'col' }, h('span', { class: 'jp-gpupool-sr' }, 'Actions')) : null
      )
    )
  );
  const body = h('tbody');
  for (const p of status.projects) {
    body.appendChild(projectRow(p, names, status.admin, onEdit));
    const recent = recentRow(p, status.admin ? 4 : 3);
    if (recent) {
      body.appendChild(recent);
    }
  }
  table.appendChild(body);
  const children: HTMLElement[] = [table];
  if (status.admin) {
    const add = h(
      'button',
      { class: 'jp-gpupool-button', type: 'button', 'aria-label': 'Add a project' },
      'Add project'
    );
    add.addEventListener('click', () => onEdit(null));
    children.push(add);
  }
  if (status.projects.length === 0) {
    children.unshift(h('p', { class: 'jp-gpupool-empty' }, 'No projects yet.'));
  }
  return children;
}

/** A project against its quotas: kernel shares against the build quota, training against the guarantee. */
function projectRow(p: IProject, names: string[], admin: boolean, onEdit: (project: IProject) => void): HTMLElement {
  const buildFull = p.build_quota > 0 && p.usage.build >= p.build_quota - 1e-9;
  const over = p.usage.train_over_quota > 0;
  const limit = p.train_limit === null || p.train_limit === undefined ? '' : `, limit ${formatGpus(p.train_limit)}`;
  const cells: HTMLElement[] = [
    h(
      'th',
      { scope: 'row' },
      h('span', { class: 'jp-gpupool-swatch', style: `background:${projectColor(p.name, names)}` }),
      p.name,
      waiting(p) ? h('div', { class: 'jp-gpupool-help' }, waiting(p)) : null
    ),
    h(
      'td',
      { class: buildFull ? 'jp-mod-full' : '', title: buildFull ? 'Build quota exhausted: new GPU kernels are refused' : '' },
      meter(p.usage.build, p.build_quota, `${p.name} build quota`),
      `${formatGpus(p.usage.build)}/${formatGpus(p.build_quota)}`,
      buildFull ? h('span', { class: 'jp-gpupool-flag' }, ' full') : ''
    ),
    h(
      'td',
      {
        class: over ? 'jp-mod-over' : '',
        title: over
          ? `${formatGpus(p.usage.train_over_quota)} GPU over the guarantee: those jobs may be paused when another project claims its share${limit}`
          : `guarantee ${formatGpus(p.train_guarantee)} GPU${limit}`
      },
      meter(p.usage.train, p.train_guarantee, `${p.name} training guarantee`),
      `${formatGpus(p.usage.train)}/${formatGpus(p.train_guarantee)}`,
      over ? h('span', { class: 'jp-gpupool-flag' }, ` +${formatGpus(p.usage.train_over_quota)} over`) : ''
    )
  ];
  if (admin) {
    const edit = h(
      'button',
      {
        class: 'jp-gpupool-button jp-gpupool-icon-button',
        type: 'button',
        'aria-label': `Edit quotas of project ${p.name}`,
        title: `Edit quotas of project ${p.name}`
      },
      '\u270E'
    );
    edit.addEventListener('click', () => onEdit(p));
    cells.push(h('td', {}, edit));
  }
  return h('tr', { 'data-project': p.name, class: over ? 'jp-mod-over' : '' }, ...cells);
}

/** A project's waiting work as `gpupool status` counts it: "2 pending · 1 paused", or ''. */
function waiting(p: IProject): string {
  const parts = [p.pending ? `${p.pending} pending` : '', p.paused ? `${p.paused} paused` : ''];
  return parts.filter(Boolean).join(' · ');
}

/** A small bar: used against a quota, overflowing in the warning color. */
function meter(used: number, quota: number, label: string): HTMLElement {
  const scale = Math.max(quota, used, 1e-9);
  const within = Math.min(used, quota);
  const over = Math.max(0, used - quota);
  return h(
    'span',
    {
      class: 'jp-gpupool-meter',
      role: 'meter',
      'aria-label': label,
      'aria-valuemin': 0,
      'aria-valuemax': quota,
      'aria-valuenow': used,
      'aria-valuetext': `${formatGpus(used)} of ${formatGpus(quota)} GPU`
    },
    h('span', { class: 'jp-gpupool-meter-fill', style: `width:${(within / scale) * 100}%` }),
    over > 0 ? h('span', { class: 'jp-gpupool-meter-over', style: `width:${(over / scale) * 100}%` }) : null
  );
}

/**
 * The line under a project's row: GPU-hours it held lately and, with history kept, its training use
 * against its fair share (a row of its own: the sidebar is too narrow for another column).
 */
function recentRow(p: IProject, columns: number): HTMLElement | null {
  const hours = p.recent_gpu_hours ? p.recent_gpu_hours.build + p.recent_gpu_hours.train : null;
  const fair = p.fair_share;
  if (hours === null || !fair) {
    return null;
  }
  const used = hours > 0 && hours < 0.01 ? '<0.01' : String(Number(hours.toFixed(hours >= 100 ? 0 : 2)));
  const standing = fair.percent === null ? '' : `, ${fair.percent}% of its fair share`;
  const title =
    fair.percent === null
      ? 'GPU-hours held lately. No usage history is kept (half-life 0): idle GPUs are shared by what runs now.'
      : `GPU-hours held lately (an hour one half-life ago counts half). Training: ${formatGpus(fair.recent_gpus)} GPU ` +
        `on average lately, of a fair share of ${formatGpus(fair.gpus)} GPU. Idle GPUs beyond guarantees go first ` +
        'to the projects that used least of their fair share lately.';
  return h(
    'tr',
    { class: 'jp-gpupool-recent', 'data-recent-of': p.name },
    h('td', { colspan: String(columns), title }, `Recent: ${used} GPU-h${standing}`)
  );
}
