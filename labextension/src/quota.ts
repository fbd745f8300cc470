/**
 * The admin's project editor: quotas and weight, through PUT /projects/{name}.
 *
 * The scheduler validates the numbers; its 4xx sentence is shown back in the
 * dialog so the admin can fix the field and try again.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { api, describeError, GpupoolError, IProject } from './api';
import { IQuotaDraft, toProjectUpdate } from './drafts';
import { h } from './dom';

class QuotaForm extends Widget implements Dialog.IBodyWidget<IQuotaDraft> {
  private _inputs: Record<keyof IQuotaDraft, HTMLInputElement>;

  constructor(draft: IQuotaDraft, isNew: boolean, error: string) {
    super({ node: document.createElement('form') });
    this.addClass('jp-gpupool-quota');
    this.node.addEventListener('submit', ev => ev.preventDefault());
    const field = (key: keyof IQuotaDraft, label: string, help: string, attrs: Record<string, string | number> = {}) => {
      const input = h('input', {
        id: `jp-gpupool-quota-${key}`,
        name: key,
        type: 'text',
        value: draft[key],
        'aria-describedby': `jp-gpupool-quota-${key}-help`,
        ...attrs
      });
      const row = [
        h('label', { for: input.id }, label),
        h('div', {}, input, h('div', { id: `jp-gpupool-quota-${key}-help`, class: 'jp-gpupool-help' }, help))
      ];
      return { input, row };
    };
    const name = field('name', 'Project', 'Letters, digits, dashes.', isNew ? {} : { readonly: 'true' });
    const build = field('build_quota', 'Build quota', 'GPUs for notebook kernels (fractions allowed, e.g. 1.5).', {
      inputmode: 'decimal'
    });
    const guarantee = field('train_guarantee', 'Training guarantee', 'GPUs the project always gets back for training.', {
      inputmode: 'decimal'
    });
    const limit = field('train_limit', 'Training limit', 'Most GPUs it may use for training; empty for no limit.', {
      inputmode: 'decimal'
    });
    const weight = field('weight', 'Weight', 'Share of idle GPUs beyond guarantees, relative to other projects.', {
      inputmode: 'decimal'
    });
    this._inputs = {
      name: name.input,
      build_quota: build.input,
      train_guarantee: guarantee.input,
      train_limit: limit.input,
      weight: weight.input
    };
    this.node.append(
      error ? h('div', { class: 'jp-gpupool-error', role: 'alert' }, error) : '',
      h(
        'div',
        { class: 'jp-gpupool-form-grid' },
        ...name.row,
        ...build.row,
        ...guarantee.row,
        ...limit.row,
        ...weight.row
      )
    );
  }

  getValue(): IQuotaDraft {
    const out = {} as IQuotaDraft;
    for (const [key, input] of Object.entries(this._inputs)) {
      out[key as keyof IQuotaDraft] = input.value;
    }
    return out;
  }
}

/**
 * Edit (or, with no project, create) a project; resolves to the saved project
 * or null when cancelled.
 */
export async function editProject(project: IProject | null): Promise<IProject | null> {
  let draft: IQuotaDraft = {
    name: project?.name ?? '',
    build_quota: String(project?.build_quota ?? 1),
    train_guarantee: String(project?.train_guarantee ?? 0),
    train_limit: project?.train_limit === null || project?.train_limit === undefined ? '' : String(project.train_limit),
    weight: String(project?.weight ?? 1)
  };
  let error = '';
  for (;;) {
    const result = await showDialog<IQuotaDraft>({
      title: project ? `Quotas of project ${project.name}` : 'New project',
      body: new QuotaForm(draft, project === null, error),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save', ariaLabel: 'Save project quotas' })],
      focusNodeSelector: project ? '#jp-gpupool-quota-build_quota' : '#jp-gpupool-quota-name'
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    draft = result.value;
    try {
      const saved = await api.setProject(draft.name.trim(), toProjectUpdate(draft));
      Notification.success(`Saved the quotas of project ${saved.name}.`, { autoClose: 4000 });
      return saved;
    } catch (err) {
      if (err instanceof GpupoolError && err.status >= 400 && err.status < 500 && err.status !== 403) {
        error = describeError(err);
        continue;
      }
      if (err instanceof Error && !(err instanceof GpupoolError)) {
        error = err.message;
        continue;
      }
      Notification.error(`Could not save project ${draft.name}: ${describeError(err)}`, { autoClose: false });
      return null;
    }
  }
}
