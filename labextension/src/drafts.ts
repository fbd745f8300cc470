/**
 * Dialog drafts (what the user typed) turned into API request bodies.
 *
 * Pure functions with no DOM or JupyterLab imports, so the validation rules
 * and their messages are unit-tested on their own (ui-tests/tests/drafts.spec.ts).
 * Each throws an Error whose message is one sentence naming the bad field.
 */
import type { IParameter, IProjectUpdate, IPromoteRequest } from './api';
import { fewestNodes, formatGpuAmount, MAX_REPLICAS, parseGpus, parseParameter } from './format';

/** What the user typed, kept between attempts when validation fails. */
export interface IPromoteDraft {
  project: string;
  gpus: string;
  priority: string;
  parameters: Record<string, string>;
  /** Replicas of a distributed run (whole GPUs only); empty or absent means 1. */
  replicas?: string;
}

/** The replicas a draft asks for: a whole number 1..MAX_REPLICAS (empty: 1). */
export function parseReplicas(text: string | undefined): number {
  const raw = (text ?? '').trim();
  if (raw === '') {
    return 1;
  }
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || value < 1 || value > MAX_REPLICAS) {
    throw new Error(`Replicas must be a whole number from 1 to ${MAX_REPLICAS}, not '${raw}'.`);
  }
  return value;
}

/**
 * Why no node of the pool can hold a request, as one sentence, or null when it
 * fits (or there is nothing to check). `nodeGpus`: each node's GPU count;
 * empty when the pool's nodes are unknown or come and go (Kubernetes), where a
 * request may wait for a node that is not there yet. Only whole GPUs are
 * checked: a share of one GPU fits on any GPU.
 */
export function fitProblem(gpus: number | undefined, replicas: number, nodeGpus: number[]): string | null {
  const whole = gpus ?? 0;
  if (whole < 1 || nodeGpus.length === 0 || fewestNodes(replicas, whole, nodeGpus) !== null) {
    return null;
  }
  const largest = Math.max(...nodeGpus);
  const room = nodeGpus.reduce((n, size) => n + Math.floor(size / whole), 0);
  const each = formatGpuAmount(whole);
  if (room === 0) {
    return `No node of the pool has ${each} (the largest has ${formatGpuAmount(largest)}): ask for at most ${largest}.`;
  }
  return (
    `The pool's nodes hold at most ${room} replica${room === 1 ? '' : 's'} of ${each}, not ${replicas}: ` +
    'ask for fewer replicas or fewer GPUs each.'
  );
}

/**
 * Validate a draft into the POST /promote body; throws an Error with one
 * sentence naming the field that is wrong, or saying why the pool cannot hold
 * it (`nodeGpus`, see `fitProblem`).
 */
export function toRequest(
  path: string,
  draft: IPromoteDraft,
  parameters: IParameter[],
  nodeGpus: number[] = []
): IPromoteRequest {
  const body: IPromoteRequest = { path };
  if (draft.project) {
    body.project = draft.project;
  }
  const amount = parseGpus(draft.gpus);
  Object.assign(body, amount);
  const replicas = parseReplicas(draft.replicas);
  if (replicas > 1) {
    if (!amount.gpus) {
      throw new Error('Replicas above 1 need whole GPUs per replica (1, 2, 8…), not a fraction or CPU only.');
    }
    body.replicas = replicas;
  }
  const problem = fitProblem(amount.gpus, replicas, nodeGpus);
  if (problem) {
    throw new Error(problem);
  }
  const priority = draft.priority.trim() === '' ? 0 : Number(draft.priority);
  if (!Number.isInteger(priority)) {
    throw new Error(`Priority must be a whole number, not '${draft.priority}'.`);
  }
  body.priority = priority;
  const changed: Record<string, unknown> = {};
  for (const p of parameters) {
    const text = draft.parameters[p.name];
    if (text === undefined || text.trim() === (p.default ?? '').trim()) {
      continue;
    }
    try {
      changed[p.name] = parseParameter(text, p.inferred_type_name ?? '');
    } catch (err) {
      throw new Error(`Parameter ${p.name}: ${(err as Error).message}`);
    }
  }
  if (Object.keys(changed).length > 0) {
    body.parameters = changed;
  }
  return body;
}

/** The project editor's fields, as typed. */
export interface IQuotaDraft {
  name: string;
  build_quota: string;
  train_guarantee: string;
  train_limit: string;
  weight: string;
}

/** Validate the draft into the PUT body; throws a sentence naming the bad field. */
export function toProjectUpdate(draft: IQuotaDraft): IProjectUpdate {
  const num = (key: keyof IQuotaDraft, label: string): number => {
    const value = Number(draft[key].trim());
    if (draft[key].trim() === '' || !Number.isFinite(value) || value < 0) {
      throw new Error(`${label} must be a number of GPUs of at least 0, not '${draft[key]}'.`);
    }
    return value;
  };
  const update: IProjectUpdate = {
    build_quota: num('build_quota', 'Build quota'),
    train_guarantee: num('train_guarantee', 'Training guarantee'),
    weight: num('weight', 'Weight'),
    train_limit: draft.train_limit.trim() === '' ? null : num('train_limit', 'Training limit')
  };
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(draft.name.trim())) {
    throw new Error(`A project name is letters, digits, '.', '_' and '-', not '${draft.name}'.`);
  }
  return update;
}
