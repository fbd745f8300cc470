/**
 * The Launcher's GPU kernels in the order of their share: ¼, ½, 1 GPU.
 *
 * JupyterLab's Launcher sorts a section's cards by rank (0 for the default
 * kernel, Infinity for every other kernel), then by label with
 * `localeCompare`. A collator reads "¼" as "1⁄4" and "½" as "1⁄2", so
 * "Python 3 (¼ GPU)", "Python 3 (½ GPU)" and "Python 3 (1 GPU)" came out
 * 1, ½, ¼. The cards carry their kernelspec's metadata, where the server
 * extension writes each GPU kernel's share (`metadata.gpupool.gpu_fraction`,
 * jupyter_gpupool/kernelspecs.py): each such card, as the notebook and
 * console plugins add it, is ranked by its share instead, so the GPU kernels
 * stand together in share order after the default kernel (which keeps rank 0)
 * and before the other kernels. The labels stay as they are.
 */
import type { ILauncher } from '@jupyterlab/launcher';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

/** Above every rank JupyterLab gives (0 for the default kernel), below Infinity (other kernels). */
const GPU_KERNEL_RANK = 1000;

/** The GPU share of a Launcher card for one of our kernelspecs, or null for any other card. */
export function gpuShareOf(item: ILauncher.IItemOptions): number | null {
  const kernel = item.metadata?.kernel as { gpupool?: { gpu_fraction?: unknown } } | undefined;
  const share = kernel?.gpupool?.gpu_fraction;
  return typeof share === 'number' && Number.isFinite(share) && share > 0 ? share : null;
}

/**
 * Rank the GPU kernels' cards by share, now and whenever cards are added
 * (the kernel plugins add them again when the kernelspecs change). Does
 * nothing with a launcher that does not list its items.
 */
export function orderGpuKernels(launcher: ILauncher): IDisposable {
  const model = launcher as Partial<ILauncher.IModel>;
  if (typeof model.items !== 'function' || !model.stateChanged) {
    return new DisposableDelegate(() => undefined);
  }
  const seen = new WeakSet<ILauncher.IItemOptions>();
  const rank = (): void => {
    for (const item of model.items!()) {
      if (seen.has(item)) {
        continue;
      }
      seen.add(item);
      const share = gpuShareOf(item);
      // The default kernel stays first (rank 0), even when it is a GPU kernel.
      if (share !== null && item.rank !== 0) {
        // The Launcher keeps its own copy of each card's options and reads its rank at render,
        // which follows this change (the stateChanged that brought the card schedules it).
        (item as { rank?: number }).rank = GPU_KERNEL_RANK + share;
      }
    }
  };
  rank();
  model.stateChanged.connect(rank);
  return new DisposableDelegate(() => model.stateChanged?.disconnect(rank));
}
