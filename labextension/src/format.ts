/**
 * Small formatting helpers shared by the panel, the dialogs and the status bar.
 *
 * Kept free of DOM and JupyterLab imports so they stay trivially testable and
 * the same wording appears everywhere (¼ GPU, 20.0 GiB, "3 min ago").
 */
import type { IJob, IJobRequest } from './api';

const FRACTIONS: Record<string, string> = {
  '0.125': '⅛',
  '0.25': '¼',
  '0.333': '⅓',
  '0.5': '½',
  '0.667': '⅔',
  '0.75': '¾'
};

/** A GPU amount as people say it: "¼", "1.5", "2". */
export function formatGpus(gpus: number): string {
  if (!Number.isFinite(gpus)) {
    return '–';
  }
  const whole = Math.floor(gpus + 1e-9);
  const rest = Math.round((gpus - whole) * 1000) / 1000;
  const glyph = FRACTIONS[String(rest)];
  if (rest === 0) {
    return String(whole);
  }
  if (glyph !== undefined) {
    return whole === 0 ? glyph : `${whole}${glyph}`;
  }
  return String(Math.round(gpus * 100) / 100);
}

/**
 * A GPU amount with its noun, as a sentence needs it: "¼ GPU", "1 GPU",
 * "1½ GPUs", "4 GPUs", "0 GPUs" (a share of one GPU or less is singular).
 */
export function formatGpuAmount(gpus: number): string {
  return `${formatGpus(gpus)} GPU${gpus > 0 && gpus <= 1 ? '' : 's'}`;
}

/** The GPUs a job asked for, in words: "¼ GPU", "2 GPUs", "20.0 GiB GPU memory", "CPU only". */
export function formatRequest(request: IJobRequest | null | undefined): string {
  if (!request) {
    return 'CPU only';
  }
  if (request.gpu_fraction) {
    return `${formatGpus(request.gpu_fraction)} GPU`;
  }
  if (request.gpus) {
    const each = `${formatGpus(request.gpus)} GPU${request.gpus === 1 ? '' : 's'}`;
    return (request.replicas ?? 1) > 1 ? `${request.replicas} × ${each}` : each;
  }
  if (request.gpu_memory) {
    return `${formatBytes(request.gpu_memory)} GPU memory`;
  }
  return 'CPU only';
}

/** Most replicas a promote may ask for (the scheduler's bound too, docs/design.md). */
export const MAX_REPLICAS = 64;

/**
 * The fewest nodes `replicas` replicas of `gpus` whole GPUs each fit on, given
 * each node's GPU count (replicas go on as few nodes as possible, several on one
 * node when it has room); null when the pool's nodes cannot hold them all.
 */
export function fewestNodes(replicas: number, gpus: number, nodeGpus: number[]): number | null {
  if (replicas < 1 || gpus < 1) {
    return null;
  }
  let placed = 0;
  let used = 0;
  for (const size of [...nodeGpus].sort((a, b) => b - a)) {
    const fit = Math.floor(size / gpus);
    if (fit === 0) {
      break;
    }
    placed += fit;
    used += 1;
    if (placed >= replicas) {
      return used;
    }
  }
  return null;
}

/**
 * The line under the promote dialog's Replicas field: the job's total and the
 * nodes it needs, "= 16 GPUs on 2 nodes", or why the pool cannot hold it.
 */
export function describeGang(replicas: number, gpus: number, nodeGpus: number[]): string {
  const total = `= ${formatGpuAmount(replicas * gpus)}`;
  const nodes = fewestNodes(replicas, gpus, nodeGpus);
  if (nodes !== null) {
    return `${total} on ${nodes} node${nodes === 1 ? '' : 's'}`;
  }
  const room = nodeGpus.reduce((n, size) => n + Math.floor(size / gpus), 0);
  const per = formatGpuAmount(gpus);
  return room === 0
    ? `${total}: no node of the pool has ${per}`
    : `${total}: the pool's nodes hold at most ${room} replica${room === 1 ? '' : 's'} of ${per}`;
}

/** A gang's replicas, one line each: "replica 0 on node-a: GPUs 0–7 (A100-80GB)". */
export function formatReplicas(job: IJob): string[] {
  return (job.assignment?.replicas ?? []).map(r => {
    const indexes = r.gpus.map(g => g.index);
    const models = [...new Set(r.gpus.map(g => g.model))].join(', ');
    return `replica ${r.rank} on ${r.node}: ${indexRange(indexes)}${models ? ` (${models})` : ''}`;
  });
}

/** GPU indexes as people read them: "GPU 3", "GPUs 0–7", "GPUs 0, 2, 5". */
function indexRange(indexes: number[]): string {
  if (indexes.length === 0) {
    return 'no GPU';
  }
  const sorted = [...indexes].sort((a, b) => a - b);
  if (sorted.length === 1) {
    return `GPU ${sorted[0]}`;
  }
  const consecutive = sorted.every((v, i) => i === 0 || v === sorted[i - 1] + 1);
  return consecutive ? `GPUs ${sorted[0]}–${sorted[sorted.length - 1]}` : `GPUs ${sorted.join(', ')}`;
}

/** The nodes a job runs on, in rank order without repeats ("node-a, node-b"), or ''. */
export function jobNodes(job: IJob): string {
  const replicas = job.assignment?.replicas ?? [];
  const names = replicas.length > 0 ? replicas.map(r => r.node) : job.assignment ? [job.assignment.node] : [];
  return [...new Set(names.filter(n => !!n))].join(', ');
}

/** The share a job holds, summed over its assigned GPUs (in GPUs). */
export function jobShare(job: IJob): number {
  const gpus = job.assignment?.gpus ?? [];
  if (gpus.length > 0) {
    return gpus.reduce((sum, g) => sum + g.milli, 0) / 1000;
  }
  return job.request?.gpu_fraction ?? (job.request?.gpus ?? 0) * (job.request?.replicas ?? 1);
}

/** The GPU memory limit of a job, summed over its assigned GPUs (bytes), or null. */
export function jobMemoryLimit(job: IJob): number | null {
  const gpus = job.assignment?.gpus ?? [];
  const limits = gpus.map(g => g.memory_limit).filter((m): m is number => typeof m === 'number');
  return limits.length > 0 ? limits.reduce((a, b) => a + b, 0) : null;
}

/** Bytes in binary units with one decimal: "20.0 GiB". */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** A duration in seconds: "45 s", "12 min", "3 h 5 min". */
export function formatDuration(seconds: number): string {
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 3600) {
    return `${Math.round(seconds / 60)} min`;
  }
  const h = Math.floor(seconds / 3600);
  return `${h} h ${Math.round((seconds - h * 3600) / 60)} min`;
}

/** A Unix time (seconds) as local date and clock time, or '–'. */
export function formatTime(t: number | null | undefined): string {
  if (!t) {
    return '–';
  }
  const d = new Date(t * 1000);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

/** Clock time of a Unix time (seconds), for chart axes. */
export function formatClock(t: number): string {
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

/** The basename of a path ("a/b/c.ipynb" -> "c.ipynb"). */
export function basename(path: string): string {
  const parts = path.split('/');
  return parts[parts.length - 1] || path;
}

/**
 * Parse what the user typed in the GPUs field.
 *
 * "0.25", "1/4" and "¼" mean a fraction of one GPU; "2" means two whole GPUs;
 * "0" or an empty field means CPU only. Anything else is an error with a
 * sentence saying what is accepted.
 */
export function parseGpus(text: string): { gpus?: number; gpu_fraction?: number } {
  const raw = text.trim();
  if (raw === '' || raw === '0') {
    return {};
  }
  const glyphs: Record<string, number> = { '¼': 0.25, '½': 0.5, '¾': 0.75, '⅛': 0.125 };
  let value: number;
  if (raw in glyphs) {
    value = glyphs[raw];
  } else if (/^\d+\s*\/\s*\d+$/.test(raw)) {
    const [a, b] = raw.split('/').map(s => Number(s.trim()));
    value = a / b;
  } else {
    value = Number(raw);
  }
  if (!Number.isFinite(value) || value < 0) {
    throw new Error(`GPUs must be a whole number (2) or a fraction below one (0.25 or 1/4), not '${raw}'.`);
  }
  if (value === 0) {
    return {};
  }
  if (value < 1) {
    return { gpu_fraction: Math.round(value * 1000) / 1000 };
  }
  if (!Number.isInteger(value)) {
    throw new Error(`More than one GPU must be a whole number: '${raw}' is neither whole nor below one.`);
  }
  return { gpus: value };
}

/**
 * Turn the text a user typed for a papermill parameter into the value to send.
 *
 * `inferred_type_name` comes from papermill's inspection ("int", "float",
 * "bool", "str", "None"...). The default is Python source, so strings come
 * quoted; we accept either a quoted or a bare string.
 */
export function parseParameter(text: string, typeName: string): unknown {
  const raw = text.trim();
  const type = typeName.toLowerCase();
  if (type === 'int' || type === 'float') {
    const n = Number(raw);
    if (!Number.isFinite(n) || (type === 'int' && !Number.isInteger(n))) {
      throw new Error(`'${raw}' is not a valid ${type}.`);
    }
    return n;
  }
  if (type === 'bool') {
    if (/^(true|1|yes)$/i.test(raw)) {
      return true;
    }
    if (/^(false|0|no)$/i.test(raw)) {
      return false;
    }
    throw new Error(`'${raw}' is not True or False.`);
  }
  if (type === 'str') {
    return unquote(raw);
  }
  if (raw === 'None') {
    return null;
  }
  if (raw === 'True' || raw === 'False') {
    return raw === 'True';
  }
  try {
    return JSON.parse(raw);
  } catch {
    return unquote(raw);
  }
}

function unquote(raw: string): string {
  const m = /^(['"])(.*)\1$/s.exec(raw);
  return m ? m[2] : raw;
}
