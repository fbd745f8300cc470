/**
 * The GPU Pool panel's job detail: what a job asked for and got, when it ran, its output notebook, and
 * for a multi-node gang each replica and a choice of whose log to read. Pure rendering; the panel owns
 * the selection, the log and the buttons' actions.
 */
import { FINAL_STATES, IJob } from './api';
import { h } from './dom';
import { basename, formatDuration, formatGpuAmount, formatGpus, formatRequest, formatTime, jobShare } from './format';
import { gangGpus, isGang, logPicker, replicaList } from './replicas';

export interface IJobDetailOptions {
  /** The pool has several nodes: a GPU is named with its node. */
  multiNode: boolean;
  /** Open a file in Lab (the output notebook). */
  openPath: (path: string) => void;
  /** The header's Close button and the job's own controls (pause, resume, cancel), made by the panel. */
  close: HTMLElement;
  control: HTMLElement | null;
  /** The replica whose log is shown (null: all), and how to show another. */
  logReplica: number | null;
  switchLog: (replica: number | null) => void;
}

export function isFinal(job: IJob): boolean {
  return (FINAL_STATES as readonly string[]).includes(job.state);
}

/** The detail's children: header, facts, actions and (for a gang) the log choice. */
export function jobDetail(job: IJob, options: IJobDetailOptions): (HTMLElement | string)[] {
  const onNode = options.multiNode && job.assignment ? `${job.assignment.node} · ` : '';
  const rows: [string, string][] = [
    ['State', job.state + (job.reason ? ` — ${job.reason}` : '')],
    ['Project', job.project],
    ['User', job.user],
    ['Request', formatRequest(job.request)],
    [
      'GPUs',
      isGang(job)
        ? gangGpus(job, isFinal(job))
        : (job.assignment?.gpus ?? [])
            .map(g => `${onNode}GPU ${g.index} ${g.model} ×${formatGpus(g.milli / 1000)}`)
            .join(', ') || (isFinal(job) ? '–' : 'none yet')
    ],
    ['Share', formatGpuAmount(jobShare(job))],
    ['Priority', String(job.priority)],
    ['Submitted', formatTime(job.submitted_at)],
    ['Started', formatTime(job.started_at)],
    [
      job.finished_at ? 'Finished' : 'Ran',
      job.finished_at
        ? `${formatTime(job.finished_at)}${job.started_at ? ` (ran ${formatDuration(job.finished_at - job.started_at)})` : ''}`
        : '–'
    ],
    ['Attempts', String(job.attempts)],
    ['Exit code', job.exit_code === null || job.exit_code === undefined ? '–' : String(job.exit_code)]
  ];
  const actions: HTMLElement[] = [];
  if (job.output_notebook) {
    const out = job.output_notebook;
    const openOut = h(
      'button',
      {
        class: 'jp-gpupool-button jp-mod-accept jp-gpupool-open-output',
        type: 'button',
        'aria-label': `Open output notebook ${out}`,
        title: out
      },
      'Open output notebook'
    );
    openOut.addEventListener('click', () => options.openPath(out));
    actions.push(openOut);
  }
  return [
    h(
      'header',
      {},
      h('h3', { tabindex: -1 }, `${job.name || job.id}`, h('span', { class: 'jp-gpupool-help' }, ` ${job.id}`)),
      options.close
    ),
    h(
      'dl',
      { class: 'jp-gpupool-dl' },
      ...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
      ...(isGang(job) ? [h('dt', {}, 'Replicas'), h('dd', {}, replicaList(job, isFinal(job), options.openPath))] : []),
      job.output_notebook ? h('dt', {}, 'Output') : null,
      job.output_notebook ? h('dd', { title: job.output_notebook }, basename(job.output_notebook)) : null
    ),
    h('div', { class: 'jp-gpupool-actions' }, ...actions, options.control ?? ''),
    isGang(job) ? logPicker(job, options.logReplica, options.switchLog) : ''
  ];
}
