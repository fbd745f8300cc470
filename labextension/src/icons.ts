/** The extension's icons (theme-aware through the `jp-icon3` class). */
import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../style/icons/gpu.svg';
import promoteSvg from '../style/icons/promote.svg';

export const gpuIcon = new LabIcon({ name: 'jupyter-gpupool:gpu', svgstr: gpuSvg });
export const promoteIcon = new LabIcon({ name: 'jupyter-gpupool:promote', svgstr: promoteSvg });
