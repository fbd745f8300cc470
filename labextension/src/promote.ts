/**
 * "Promote to training": the dialog and the submit.
 *
 * The dialog asks for the project, the GPUs (whole count or a fraction),
 * the replicas of a distributed run (shown for whole GPUs: N processes that
 * start together, each on its own GPUs, with the total and the nodes it needs
 * under it), the priority and the notebook's papermill parameters, prefilled from its
 * `parameters` cell. Only parameters the user changed are sent, so the run
 * keeps the notebook's own defaults (and their Python types) otherwise.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { api, describeError, IParameter, IPromoteRequest, IStatus } from './api';
import { h } from './dom';
import { fitProblem, IPromoteDraft, parseReplicas, toRequest } from './drafts';
import { basename, describeGang, formatGpuAmount, formatGpus, MAX_REPLICAS, parseGpus } from './format';

let formCounter = 0;

/** The dialog body: a plain form whose values are read back by `getValue`. */
export class PromoteForm extends Widget implements Dialog.IBodyWidget<IPromoteDraft> {
  private _project: HTMLSelectElement;
  private _gpus: HTMLInputElement;
  private _priority: HTMLInputElement;
  private _replicas: HTMLInputElement;
  private _replicasCell: HTMLElement;
  private _params = new Map<string, HTMLInputElement>();
  /** The node sizes a request is checked against (see `fitNodes`). */
  private _fitNodes: number[];
  /** Why the pool cannot hold what the fields ask for, or null. */
  private _problem: string | null = null;

  constructor(
    readonly path: string,
    status: IStatus,
    readonly parameters: IParameter[],
    draft: IPromoteDraft,
    error = ''
  ) {
    super({ node: document.createElement('form') });
    this.addClass('jp-gpupool-promote');
    const id = `jp-gpupool-promote-${++formCounter}`;
    this.node.setAttribute('aria-label', `Promote ${basename(path)} to training`);
    this.node.addEventListener('submit', ev => ev.preventDefault());

    this._project = h(
      'select',
      { id: `${id}-project`, name: 'project', 'aria-describedby': `${id}-project-help` },
      ...status.projects.map(p =>
        h('option', { value: p.name, selected: p.name === draft.project }, p.name)
      )
    );
    const projectHelp = h('div', { id: `${id}-project-help`, class: 'jp-gpupool-help' });
    const describeProject = (): void => {
      const p = status.projects.find(x => x.name === this._project.value);
      projectHelp.textContent = p
        ? `${formatGpuAmount(p.train_guarantee)} guaranteed for training, ${formatGpus(p.usage.train)} in use now; ` +
          `${p.pending} ${p.pending === 1 ? 'job' : 'jobs'} pending` +
          (p.paused ? `, ${p.paused} paused.` : '.')
        : '';
    };
    this._project.addEventListener('change', describeProject);
    describeProject();

    this._gpus = h('input', {
      id: `${id}-gpus`,
      name: 'gpus',
      type: 'text',
      inputmode: 'decimal',
      value: draft.gpus,
      'aria-describedby': `${id}-gpus-help ${id}-gpus-fit`
    });
    // Shown, and Promote disabled, while no node of the pool can hold the request.
    const fitLine = h('div', { id: `${id}-gpus-fit`, class: 'jp-gpupool-error', role: 'alert', hidden: true });
    this._replicas = h('input', {
      id: `${id}-replicas`,
      name: 'replicas',
      type: 'number',
      min: 1,
      max: MAX_REPLICAS,
      step: 1,
      value: draft.replicas || '1',
      'aria-describedby': `${id}-replicas-total ${id}-replicas-help`
    });
    const replicasLabel = h('label', { for: `${id}-replicas` }, 'Replicas');
    const replicasTotal = h('div', { id: `${id}-replicas-total`, class: 'jp-gpupool-help jp-gpupool-gang-total', 'aria-live': 'polite' });
    const replicasCell = (this._replicasCell = h(
      'div',
      {},
      this._replicas,
      replicasTotal,
      h(
        'div',
        { id: `${id}-replicas-help`, class: 'jp-gpupool-help' },
        'For a notebook that runs distributed: this many copies start together, each on its own GPUs ' +
          '(RANK, WORLD_SIZE, MASTER_ADDR set). Rank 0\u2019s output is the job\u2019s.'
      )
    ));
    const nodeGpus = (status.pool?.nodes ?? []).map(n => n.gpus.length);
    this._fitNodes = fitNodes(status);
    // Shown only for whole GPUs: a gang's replicas each hold whole GPUs of one node.
    const describeReplicas = (): void => {
      let whole = 0;
      try {
        whole = parseGpus(this._gpus.value).gpus ?? 0;
      } catch {
        whole = 0;
      }
      replicasLabel.hidden = replicasCell.hidden = whole < 1;
      const n = Number(this._replicas.value.trim() || '1');
      replicasTotal.textContent =
        whole >= 1 && Number.isInteger(n) && n >= 1 ? describeGang(n, whole, nodeGpus) : '';
      this._problem = this._fitProblem();
      fitLine.hidden = this._problem === null;
      fitLine.textContent = this._problem === null ? '' : `Cannot promote: ${this._problem}`;
      this._updateAccept();
    };
    this._gpus.addEventListener('input', describeReplicas);
    this._replicas.addEventListener('input', describeReplicas);
    describeReplicas();
    this._priority = h('input', {
      id: `${id}-priority`,
      name: 'priority',
      type: 'number',
      step: 1,
      value: draft.priority
    });

    const fields = h(
      'div',
      { class: 'jp-gpupool-form-grid' },
      h('label', { for: `${id}-project` }, 'Project'),
      h('div', {}, this._project, projectHelp),
      h('label', { for: `${id}-gpus` }, 'GPUs'),
      h(
        'div',
        {},
        this._gpus,
        h(
          'div',
          { id: `${id}-gpus-help`, class: 'jp-gpupool-help' },
          'A whole number (1, 2) or a fraction of one GPU (0.25, 1/2). 0 for CPU only.'
        ),
        fitLine
      ),
      replicasLabel,
      replicasCell,
      h('label', { for: `${id}-priority` }, 'Priority'),
      h('div', {}, this._priority, h('div', { class: 'jp-gpupool-help' }, 'Higher runs first within the project.'))
    );

    const paramRows = parameters.map(p => {
      const input = h('input', {
        id: `${id}-param-${p.name}`,
        name: `param-${p.name}`,
        type: 'text',
        class: 'jp-gpupool-param',
        value: draft.parameters[p.name] ?? p.default ?? '',
        'data-param': p.name,
        title: p.help || `${p.name} (${p.inferred_type_name})`
      });
      this._params.set(p.name, input);
      return [
        h(
          'label',
          { for: input.id },
          p.name,
          p.inferred_type_name && p.inferred_type_name !== 'None'
            ? h('span', { class: 'jp-gpupool-type' }, ` ${p.inferred_type_name}`)
            : null
        ),
        h('div', {}, input, p.help ? h('div', { class: 'jp-gpupool-help' }, p.help) : null)
      ];
    });
    const paramSection =
      parameters.length > 0
        ? h(
            'fieldset',
            { class: 'jp-gpupool-params' },
            h('legend', {}, 'Parameters (from the notebook\u2019s parameters cell)'),
            h('div', { class: 'jp-gpupool-form-grid' }, ...paramRows.flat())
          )
        : h(
            'p',
            { class: 'jp-gpupool-help' },
            'This notebook has no cell tagged "parameters": it runs as it is.'
          );

    this.node.append(
      h('p', { class: 'jp-gpupool-help' }, `Runs ${path} with papermill in the training queue; the output notebook and log land next to it.`),
      error ? h('div', { class: 'jp-gpupool-error', role: 'alert' }, error) : '',
      fields,
      paramSection
    );
  }

  protected onAfterAttach(): void {
    this._updateAccept();
  }

  /** Why the pool cannot hold the GPUs × replicas typed (null while they fit or do not parse yet). */
  private _fitProblem(): string | null {
    try {
      const replicas = this._replicasCell.hidden ? 1 : parseReplicas(this._replicas.value);
      return fitProblem(parseGpus(this._gpus.value).gpus, replicas, this._fitNodes);
    } catch {
      return null; // the field's own message comes at submit
    }
  }

  /**
   * Promote is disabled while the request cannot fit. The dialog disables it by
   * itself for invalid fields, on each input before this form hears of it; so this
   * runs after, and keeps it disabled for either reason. (Enter still submits;
   * `promoteWithDialog` then refuses with the same sentence.)
   */
  private _updateAccept(): void {
    const dialog = this.node.closest('.jp-Dialog');
    const accept = dialog?.querySelector<HTMLButtonElement>('.jp-Dialog-button.jp-mod-accept');
    if (dialog && accept) {
      accept.disabled = this._problem !== null || dialog.querySelector(':invalid') !== null;
    }
  }

  /** The raw field values (validated by `toRequest`). */
  getValue(): IPromoteDraft {
    const parameters: Record<string, string> = {};
    for (const [name, input] of this._params) {
      parameters[name] = input.value;
    }
    return {
      project: this._project.value,
      gpus: this._gpus.value,
      priority: this._priority.value,
      parameters,
      // A hidden field (a fraction of a GPU) is one replica, whatever it held before.
      replicas: this._replicasCell.hidden ? '1' : this._replicas.value
    };
  }
}

/**
 * Each node's GPU count, to check a request against; none on Kubernetes, whose
 * nodes come and go (the scheduler lets such a request wait for a node that can
 * hold it, docs/design.md).
 */
function fitNodes(status: IStatus): number[] {
  if (status.backend?.backend === 'kubernetes') {
    return [];
  }
  return (status.pool?.nodes ?? []).map(n => n.gpus.length);
}

/**
 * Ask for the promote options and submit; returns the new job, or null when
 * the user cancelled or the submit failed (a notification says why).
 */
export async function promoteWithDialog(path: string): Promise<{ job: Awaited<ReturnType<typeof api.promote>> } | null> {
  let status: IStatus;
  let parameters: IParameter[] = [];
  try {
    const [st, params] = await Promise.all([
      api.status(),
      api.parameters(path).catch(err => {
        Notification.warning(`Could not read the parameters of ${basename(path)}: ${describeError(err)}`, {
          autoClose: 6000
        });
        return { parameters: [] as IParameter[] };
      })
    ]);
    status = st;
    parameters = params.parameters ?? [];
  } catch (err) {
    Notification.error(`Cannot promote ${basename(path)}: ${describeError(err)}`, { autoClose: false });
    return null;
  }
  // Offer only the projects the user may submit into (a project with no members list is open).
  const mine = status.projects.filter(p => p.member !== false);
  if (mine.length === 0) {
    Notification.error(
      status.projects.length === 0
        ? 'Cannot promote: the GPU pool has no projects yet. Ask an admin to create one.'
        : 'Cannot promote: you are not a member of any project. Ask an admin to add you to one.',
      { autoClose: false }
    );
    return null;
  }
  status = { ...status, projects: mine };
  let draft: IPromoteDraft = {
    project: mine.some(p => p.name === status.project) ? (status.project as string) : mine[0].name,
    gpus: '1',
    priority: '0',
    parameters: {},
    replicas: '1'
  };
  let error = '';
  for (;;) {
    const body = new PromoteForm(path, status, parameters, draft, error);
    const result = await showDialog<IPromoteDraft>({
      title: `Promote ${basename(path)} to training`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Promote', ariaLabel: 'Promote to training' })],
      focusNodeSelector: 'select'
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    draft = result.value;
    let request: IPromoteRequest;
    try {
      request = toRequest(path, draft, parameters, fitNodes(status));
    } catch (err) {
      error = (err as Error).message;
      continue;
    }
    try {
      const job = await api.promote(request);
      return { job };
    } catch (err) {
      const message = describeError(err);
      // Bad input (4xx other than quota): let the user fix it in the dialog.
      const status = (err as { status?: number }).status ?? 0;
      if (status === 400 || status === 404 || status === 422) {
        error = message;
        continue;
      }
      if (status === 409) {
        Notification.warning(`Promote ${basename(path)}: ${message}`, { autoClose: false });
      } else {
        Notification.error(`Promote ${basename(path)} failed: ${message}`, { autoClose: false });
      }
      return null;
    }
  }
}
