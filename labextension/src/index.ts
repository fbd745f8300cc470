import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { api } from './api';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpupool:plugin',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    void api.status().catch(() => undefined);
  }
};
export default plugin;
