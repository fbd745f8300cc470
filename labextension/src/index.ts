/**
 * jupyter-gpupool's JupyterLab front end.
 *
 * One plugin wires the pieces: the shared event stream, the GPU Pool sidebar,
 * "Promote to training" (notebook toolbar, command palette, file browser
 * context menu), job notifications and the kernel's GPU share in the status
 * bar. Every piece talks only to the server extension's /gpupool/api.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ISessionContext, ToolbarButton } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { ILauncher } from '@jupyterlab/launcher';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { EventStream } from './events';
import { gpuIcon, promoteIcon } from './icons';
import { orderGpuKernels } from './launcherorder';
import { JobNotifier } from './notifications';
import { GpuPoolPanel } from './panel';
import { promoteWithDialog } from './promote';
import { KernelShareStatus } from './statusbar';

/** Command ids, exported for tests and for other extensions. */
export namespace CommandIDs {
  export const promote = 'gpupool:promote';
  export const openPanel = 'gpupool:open-panel';
  export const showJob = 'gpupool:show-job';
}

const PALETTE_CATEGORY = 'GPU Pool';

/** Adds the "Promote" button to every notebook's toolbar. */
class PromoteButtonExtension implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(private _app: JupyterFrontEnd) {}

  createNew(panel: NotebookPanel): IDisposable {
    const button = new ToolbarButton({
      className: 'jp-gpupool-promote-button',
      icon: promoteIcon,
      label: 'Promote',
      tooltip: 'Promote this notebook to a training job on the GPU pool',
      onClick: () => void this._app.commands.execute(CommandIDs.promote, { path: panel.context.path })
    });
    panel.toolbar.insertAfter('cellType', 'gpupool-promote', button);
    return new DisposableDelegate(() => button.dispose());
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpupool:plugin',
  description: 'GPU pool panel, promote-to-training and kernel GPU share for jupyter-gpupool.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILabShell, ILayoutRestorer, IStatusBar, IDefaultFileBrowser, ILauncher],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    labShell: ILabShell | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    fileBrowser: IDefaultFileBrowser | null,
    launcher: ILauncher | null
  ) => {
    const { commands, shell } = app;
    if (launcher) {
      // GPU kernels in share order (¼, ½, 1 GPU), not in the collator's (1, ½, ¼).
      orderGpuKernels(launcher);
    }
    const stream = new EventStream();
    const openPath = (path: string): void => {
      void commands.execute('docmanager:open', { path });
    };

    const panel = new GpuPoolPanel({ stream, openPath });
    panel.title.icon = gpuIcon;
    shell.add(panel, 'right', { rank: 600 });
    restorer?.add(panel, 'jupyter-gpupool');

    const notifier = new JobNotifier(
      {
        me: () => panel.me,
        showJob: id => void commands.execute(CommandIDs.showJob, { id }),
        openPath
      },
      stream
    );
    // Learn who we are early, so notifications work before the panel is opened.
    void panel.refresh();
    stream.start();

    commands.addCommand(CommandIDs.openPanel, {
      label: 'Show GPU Pool',
      caption: 'Open the GPU Pool panel: GPUs, projects, queue and history',
      icon: gpuIcon,
      execute: () => {
        shell.activateById(panel.id);
      }
    });

    commands.addCommand(CommandIDs.showJob, {
      label: 'Show GPU Pool Job',
      execute: async args => {
        shell.activateById(panel.id);
        const id = args.id as string | undefined;
        if (id) {
          await panel.showJob(id);
        }
      }
    });

    /** The notebook to promote: explicit path, else a selected notebook in the file browser, else the current notebook. */
    const targetPath = (args: Record<string, unknown>): string | null => {
      if (typeof args.path === 'string' && args.path) {
        return args.path;
      }
      if (args.fromBrowser && fileBrowser) {
        for (const item of fileBrowser.selectedItems()) {
          if (item.type === 'notebook' || item.path.endsWith('.ipynb')) {
            return item.path;
          }
        }
      }
      return notebooks.currentWidget?.context.path ?? null;
    };

    commands.addCommand(CommandIDs.promote, {
      label: args => (args.fromBrowser ? 'Promote to Training…' : 'Promote Notebook to Training…'),
      caption: 'Run the notebook with parameters as a training job on the GPU pool',
      icon: promoteIcon,
      isEnabled: args => targetPath(args) !== null,
      execute: async args => {
        const path = targetPath(args);
        if (!path) {
          return null;
        }
        // The run starts from the file on disk: save an open, modified copy first.
        const open = notebooks.find(w => w.context.path === path);
        if (open && open.context.model.dirty && !open.context.model.readOnly) {
          await open.context.save();
        }
        const result = await promoteWithDialog(path);
        if (result) {
          notifier.submitted(result.job, path);
          void panel.refresh(true);
        }
        return result?.job.id ?? null;
      }
    });

    if (palette) {
      palette.addItem({ command: CommandIDs.promote, category: PALETTE_CATEGORY });
      palette.addItem({ command: CommandIDs.openPanel, category: PALETTE_CATEGORY });
    }

    app.contextMenu.addItem({
      command: CommandIDs.promote,
      args: { fromBrowser: true },
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 20
    });

    app.docRegistry.addWidgetExtension('Notebook', new PromoteButtonExtension(app));

    if (statusBar) {
      const item = new KernelShareStatus(stream, () => void commands.execute(CommandIDs.openPanel));
      statusBar.registerStatusItem('jupyter-gpupool:kernel-share', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.active,
        activeStateChanged: item.activeChanged
      });
      const follow = (widget: Widget | null): void => {
        const session = (widget as unknown as { sessionContext?: ISessionContext } | null)?.sessionContext ?? null;
        item.setSession(session);
      };
      if (labShell) {
        labShell.currentChanged.connect((_, change) => follow(change.newValue));
        follow(labShell.currentWidget);
      } else {
        notebooks.currentChanged.connect((_, nb) => follow(nb));
      }
    }
  }
};

export default plugin;
