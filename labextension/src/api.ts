/**
 * Typed access to the server extension's REST API (`/gpupool/api`).
 *
 * The shapes here mirror the contract in docs/design.md; the front end talks
 * to nothing else. Every request goes through `ServerConnection.makeRequest`
 * so Jupyter's auth token and XSRF cookie are sent like for any core request.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** Final job states: a job in one of these never changes again. */
export const FINAL_STATES = ['succeeded', 'failed', 'cancelled', 'rejected'] as const;

export type JobState =
  | 'queued'
  | 'running'
  | 'paused'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'rejected';

export interface IJobRequest {
  gpus: number;
  gpu_fraction: number | null;
  gpu_memory: number | null;
  gpu_model: string | null;
  cpu: number | null;
  memory: number | null;
  /** Processes (replicas) that start together, each on `gpus` whole GPUs of one node; 1 when absent. */
  replicas?: number;
}

export interface IGpuAssignment {
  id: string;
  index: number;
  model: string;
  milli: number;
  memory_limit: number | null;
}

/** One replica of a gang job: its rank and where it runs. */
export interface IReplicaAssignment {
  rank: number;
  node: string;
  gpus: IGpuAssignment[];
}

export interface IJob {
  id: string;
  name: string;
  project: string;
  user: string;
  kind: 'train' | 'build';
  state: JobState;
  request: IJobRequest;
  priority: number;
  submitted_at: number;
  started_at: number | null;
  finished_at: number | null;
  attempts: number;
  preemptible: boolean;
  reason: string;
  /** `node` is rank 0's for a gang, `gpus` every replica's in rank order, `replicas` each replica's. */
  assignment: { node: string; gpus: IGpuAssignment[]; replicas?: IReplicaAssignment[] } | null;
  exit_code: number | null;
  workdir: string | null;
  command: string[] | null;
  labels: Record<string, string>;
  lease_expires_at: number | null;
  /** Path of the papermill output notebook, relative to the server root. */
  output_notebook?: string | null;
  /** A promoted gang: every replica's output notebook in rank order (rank 0's is `output_notebook`). */
  replica_output_notebooks?: string[];
  run_dir?: string | null;
  /** A running job's use over the last minute; null when not running or not sampled yet (absent: older scheduler). */
  recent_use?: IRecentUse | null;
  /** When its share became idle by use past its project's window (ISO time); null or absent when it is not. */
  idle_since?: string | null;
  /** With idle_since: what its project's rule does about it (cull, pause or flag). */
  idle_action?: string | null;
}

/** A running job's use over its last `window_s` seconds (the scheduler's Job.recent_use). */
export interface IRecentUse {
  window_s: number;
  /** The busy part of its share where measured (0..1); null when nothing was measured: unknown, not idle. */
  busy: number | null;
  /** The part of what it holds whose use could be measured (0..1). */
  measured: number;
  peak_memory: number;
}

/** One project's (user's, job's) allocated vs used GPUs over time, build or train. */
export interface IUseSeries {
  project?: string;
  user?: string;
  job_id?: string;
  kind: 'build' | 'train';
  /** Each bucket's start (Unix seconds); the values below are mean GPUs over the bucket. */
  t: number[];
  allocated: number[];
  /** Of `allocated`, the GPUs whose use was measured (the rest is unknown, not idle). */
  measured: number[];
  used: number[];
}

export interface IUseSeriesReply {
  since: number;
  until: number;
  step: number;
  by: 'project' | 'user' | 'job';
  series: IUseSeries[];
}

export interface IAllocation {
  job_id: string;
  project: string;
  user: string;
  kind: string;
  fraction: number;
}

export interface IGpu {
  id: string;
  index: number;
  model: string;
  memory: number;
  topology_group?: string | null;
  allocated: number;
  allocations: IAllocation[];
  utilization?: number | null;
  memory_used?: number | null;
}

export interface INode {
  name: string;
  pools: string[];
  cpu: number;
  memory: number;
  gpus: IGpu[];
}

export interface IPool {
  simulated: boolean;
  nodes: INode[];
}

export interface IProject {
  name: string;
  build_quota: number;
  train_guarantee: number;
  train_limit: number | null;
  weight: number;
  usage: { build: number; train: number; train_over_quota: number };
  /** Its queued jobs (never ran); paused ones are counted apart in `paused`. */
  pending: number;
  /** Its paused jobs (ran, were stopped, wait to resume); absent from schedulers before it. */
  paused?: number;
  /** Who may submit into the project (users, '@group'); null: open to everyone. */
  members?: string[] | null;
  /** Whether the signed-in user may submit into the project. */
  member?: boolean;
  /** GPU-hours held lately by kind, each hour weighed by its age (a half-life ago counts half). */
  recent_gpu_hours?: { build: number; train: number };
  /** Long-run share of the train pool, training GPUs held on average lately, and their ratio (null: no history kept). */
  fair_share?: { gpus: number; recent_gpus: number; percent: number | null };
}

export interface IStatus {
  simulated: boolean;
  pool: IPool;
  projects: IProject[];
  queue: { pending: number; running: number; paused: number };
  /** The scheduler's backend and its health (`backend`: 'local' or 'kubernetes'). */
  backend?: { backend?: string };
  me: string;
  project: string | null;
  admin: boolean;
  reachable: boolean;
}

/** What a GPU kernel that is still starting waits for (the server's jupyter_gpupool.starting). */
export interface IKernelStarting {
  /** "share": its share is queued behind other work; "pod": the share runs, the kernel's pod is not up yet. */
  what: 'share' | 'pod';
  /** The scheduler's reason (why it is queued), or what the pod is doing. */
  reason: string;
  since: number;
  /** When the start gives up (Unix seconds): the admin's kernel_start_timeout after `since`. */
  gives_up_at: number;
}

export interface IKernelShare {
  kernel_id: string;
  path: string | null;
  /** The share's Job; null only for a starting kernel whose share the scheduler has not answered yet. */
  job: IJob | null;
  gpu_memory_used?: number | null;
  /** Present while the kernel is starting: Lab does not know its id yet, so it is matched by `path`. */
  starting?: IKernelStarting;
}

export interface IParameter {
  name: string;
  inferred_type_name: string;
  default: string;
  help: string;
}

export interface IGpupoolEvent {
  seq: number;
  t: number;
  type: 'job' | 'pool' | 'project' | 'watchdog' | string;
  job_id?: string;
  state?: JobState;
  reason?: string;
  user?: string;
  project?: string;
}

export interface IHistorySample {
  t: number;
  /** Shares allocated per project, in milli-GPU. */
  projects: Record<string, number>;
  gpus: Record<string, { milli: number; util?: number | null; mem_used?: number | null }>;
}

export interface ILogChunk {
  data: string;
  offset: number;
  eof: boolean;
}

export interface IPromoteRequest {
  path: string;
  project?: string;
  gpus?: number;
  gpu_fraction?: number;
  priority?: number;
  parameters?: Record<string, unknown>;
  /** A gang of this many replicas, each on `gpus` whole GPUs (1 when absent). */
  replicas?: number;
}

export interface IProjectUpdate {
  build_quota?: number;
  train_guarantee?: number;
  train_limit?: number | null;
  weight?: number;
}

/**
 * An error reply of the GPU pool API, with a message meant for the user.
 *
 * `unreachable` is set for 503 (the scheduler is down or not configured) and
 * for network failures; `quota` for 409 (a build quota is exhausted or a
 * conflicting state), so callers can word their notification.
 */
export class GpupoolError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'GpupoolError';
  }

  get unreachable(): boolean {
    return this.status === 503 || this.status === 0;
  }

  get quota(): boolean {
    return this.status === 409;
  }
}

/** Turn any thrown value into one sentence for a notification or a panel line. */
export function describeError(err: unknown): string {
  if (err instanceof GpupoolError) {
    if (err.unreachable) {
      return `The GPU scheduler is unreachable: ${err.message}`;
    }
    if (err.quota) {
      return `Quota exhausted or conflict: ${err.message}`;
    }
    return err.message;
  }
  if (err instanceof Error) {
    return err.message;
  }
  return String(err);
}

/**
 * Call `/gpupool/api/<endPoint>` and return its JSON reply.
 *
 * Non-2xx replies raise a `GpupoolError` carrying the server's `error`
 * sentence (the contract promises one for every 4xx and for 503).
 */
export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'gpupool', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new GpupoolError(`cannot reach the Jupyter server (${describeError(error)})`, 0);
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const message =
      (data && typeof data === 'object' && (data.error || data.message)) ||
      (typeof data === 'string' && data.length < 300 ? data : '') ||
      response.statusText ||
      `HTTP ${response.status}`;
    throw new GpupoolError(String(message), response.status);
  }
  return data as T;
}

function jsonInit(method: string, body?: unknown): RequestInit {
  return {
    method,
    body: body === undefined ? undefined : JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' }
  };
}

/** One function per endpoint of the server extension. */
export const api = {
  status: () => requestAPI<IStatus>('status'),
  kernels: () => requestAPI<IKernelShare[]>('kernels'),
  jobs: (mine = false) => requestAPI<IJob[]>(mine ? 'jobs?mine=1' : 'jobs'),
  job: (id: string) => requestAPI<IJob>(`jobs/${encodeURIComponent(id)}`),
  logs: (id: string, offset = 0, replica: number | null = null) =>
    requestAPI<ILogChunk>(
      `jobs/${encodeURIComponent(id)}/logs?offset=${offset}` + (replica === null ? '' : `&replica=${replica}`)
    ),
  action: (id: string, action: 'pause' | 'resume' | 'cancel') =>
    requestAPI<IJob>(`jobs/${encodeURIComponent(id)}/${action}`, jsonInit('POST', {})),
  parameters: (path: string) =>
    requestAPI<{ parameters: IParameter[] }>(`parameters?path=${encodeURIComponent(path)}`),
  promote: (body: IPromoteRequest) => requestAPI<IJob>('promote', jsonInit('POST', body)),
  events: (since: number, timeout: number, signal?: AbortSignal) =>
    requestAPI<{ events: IGpupoolEvent[]; last: number }>(
      `events?since=${since}&timeout=${timeout}`,
      { signal }
    ),
  history: (since?: number) =>
    requestAPI<{ samples: IHistorySample[] }>(
      since === undefined ? 'history' : `history?since=${since}`
    ),
  use: (since: number, step?: number) =>
    requestAPI<IUseSeriesReply>(`use?since=${since}` + (step === undefined ? '' : `&step=${step}`)),
  setProject: (name: string, fields: IProjectUpdate) =>
    requestAPI<IProject>(`projects/${encodeURIComponent(name)}`, jsonInit('PUT', fields))
};
