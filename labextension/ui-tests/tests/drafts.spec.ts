/**
 * Unit tests of the front end's pure logic: how what a user types in the
 * dialogs becomes an API request, and how amounts are written. No browser
 * page is used; Playwright only runs the functions.
 */
import { expect, test } from '@playwright/test';

import type { IJob } from '../../src/api';
import { fitProblem, parseReplicas, toProjectUpdate, toRequest } from '../../src/drafts';
import {
  describeGang,
  fewestNodes,
  formatBytes,
  formatGpuAmount,
  formatGpus,
  formatReplicas,
  formatRequest,
  jobNodes,
  jobShare,
  parseGpus,
  parseParameter
} from '../../src/format';

const PARAMS = [
  { name: 'epochs', inferred_type_name: 'int', default: '3', help: '' },
  { name: 'lr', inferred_type_name: 'None', default: '0.1', help: '' },
  { name: 'label', inferred_type_name: 'None', default: '"baseline"', help: '' },
  { name: 'fast', inferred_type_name: 'bool', default: 'False', help: '' }
];

test.describe('GPU amounts', () => {
  test('fractions, counts and CPU only', () => {
    expect(parseGpus('0.25')).toEqual({ gpu_fraction: 0.25 });
    expect(parseGpus('1/2')).toEqual({ gpu_fraction: 0.5 });
    expect(parseGpus('¾')).toEqual({ gpu_fraction: 0.75 });
    expect(parseGpus(' 2 ')).toEqual({ gpus: 2 });
    expect(parseGpus('')).toEqual({});
    expect(parseGpus('0')).toEqual({});
  });

  test('bad amounts are refused with a sentence saying what is accepted', () => {
    expect(() => parseGpus('1.5')).toThrow(/whole number/);
    expect(() => parseGpus('-1')).toThrow(/fraction below one/);
    expect(() => parseGpus('lots')).toThrow(/not 'lots'/);
  });

  test('are written as people say them', () => {
    expect(formatGpus(0.25)).toBe('¼');
    expect(formatGpus(1.5)).toBe('1½');
    expect(formatGpus(2)).toBe('2');
    expect(formatGpus(0.3)).toBe('0.3');
    expect(formatBytes(21474836480)).toBe('20.0 GiB');
    expect(formatRequest({ gpus: 0, gpu_fraction: 0.5, gpu_memory: null, gpu_model: null, cpu: null, memory: null })).toBe(
      '½ GPU'
    );
    expect(formatRequest({ gpus: 2, gpu_fraction: null, gpu_memory: null, gpu_model: null, cpu: null, memory: null })).toBe(
      '2 GPUs'
    );
  });

  test('take the noun a sentence needs', () => {
    expect(formatGpuAmount(4)).toBe('4 GPUs');
    expect(formatGpuAmount(1)).toBe('1 GPU');
    expect(formatGpuAmount(0.25)).toBe('¼ GPU');
    expect(formatGpuAmount(1.5)).toBe('1½ GPUs');
    expect(formatGpuAmount(0)).toBe('0 GPUs');
  });
});

test.describe('notebook parameters', () => {
  test('typed by papermill or read as Python literals', () => {
    expect(parseParameter('5', 'int')).toBe(5);
    expect(parseParameter('0.5', 'float')).toBe(0.5);
    expect(parseParameter('True', 'bool')).toBe(true);
    expect(parseParameter("'resnet'", 'str')).toBe('resnet');
    expect(parseParameter('resnet', 'str')).toBe('resnet');
    expect(parseParameter('"x"', 'None')).toBe('x');
    expect(parseParameter('None', 'None')).toBeNull();
    expect(parseParameter('[1, 2]', 'None')).toEqual([1, 2]);
    expect(() => parseParameter('2.5', 'int')).toThrow(/not a valid int/);
  });
});

test.describe('promote request', () => {
  const draft = {
    project: 'vision',
    gpus: '0.5',
    priority: '2',
    parameters: { epochs: '3', lr: '0.1', label: '"baseline"', fast: 'False' }
  };

  test('sends only the parameters the user changed, with their types', () => {
    expect(toRequest('a/train.ipynb', draft, PARAMS)).toEqual({
      path: 'a/train.ipynb',
      project: 'vision',
      gpu_fraction: 0.5,
      priority: 2
    });
    const changed = { ...draft, parameters: { ...draft.parameters, epochs: '10', label: '"big"', fast: 'true' } };
    expect(toRequest('t.ipynb', changed, PARAMS).parameters).toEqual({ epochs: 10, label: 'big', fast: true });
  });

  test('names the field that is wrong', () => {
    expect(() => toRequest('t.ipynb', { ...draft, priority: 'high' }, PARAMS)).toThrow(/Priority/);
    expect(() => toRequest('t.ipynb', { ...draft, gpus: '2.5' }, PARAMS)).toThrow(/whole number/);
    expect(() =>
      toRequest('t.ipynb', { ...draft, parameters: { ...draft.parameters, epochs: 'ten' } }, PARAMS)
    ).toThrow(/Parameter epochs/);
  });
});

test.describe('gang jobs (replicas)', () => {
  const request = { gpus: 8, gpu_fraction: null, gpu_memory: null, gpu_model: null, cpu: null, memory: null };
  const draft = { project: 'vision', gpus: '8', priority: '0', parameters: {}, replicas: '2' };

  test('read "N × G GPUs" wherever a request is shown', () => {
    expect(formatRequest({ ...request, replicas: 2 })).toBe('2 × 8 GPUs');
    expect(formatRequest({ ...request, gpus: 1, replicas: 4 })).toBe('4 × 1 GPU');
    expect(formatRequest({ ...request, replicas: 1 })).toBe('8 GPUs');
  });

  test('a request no node can hold is refused with the reason, before it is submitted', () => {
    expect(fitProblem(8, 1, [4])).toBe('No node of the pool has 8 GPUs (the largest has 4 GPUs): ask for at most 4.');
    expect(fitProblem(1, 5, [4])).toBe(
      "The pool's nodes hold at most 4 replicas of 1 GPU, not 5: ask for fewer replicas or fewer GPUs each."
    );
    expect(fitProblem(8, 2, [8, 8])).toBeNull();
    expect(fitProblem(4, 1, [4])).toBeNull();
    expect(fitProblem(undefined, 1, [4])).toBeNull(); // a share of one GPU, or CPU only
    expect(fitProblem(64, 1, [])).toBeNull(); // nodes unknown, or a pool whose nodes come and go
    expect(() => toRequest('t.ipynb', { ...draft, replicas: '1' }, [], [4])).toThrow(/No node of the pool has 8 GPUs/);
    expect(() => toRequest('t.ipynb', { ...draft, replicas: '3' }, [], [8, 8])).toThrow(/at most 2 replicas of 8 GPUs, not 3/);
    expect(toRequest('t.ipynb', draft, [], [8, 8]).replicas).toBe(2);
  });

  test('the dialog total says how many GPUs and the fewest nodes that hold them', () => {
    expect(describeGang(2, 8, [8, 8])).toBe('= 16 GPUs on 2 nodes');
    expect(describeGang(2, 4, [8, 8])).toBe('= 8 GPUs on 1 node');
    expect(describeGang(1, 8, [8, 8])).toBe('= 8 GPUs on 1 node');
    expect(describeGang(3, 8, [8, 8])).toBe("= 24 GPUs: the pool's nodes hold at most 2 replicas of 8 GPUs");
    expect(describeGang(1, 16, [8, 8])).toBe('= 16 GPUs: no node of the pool has 16 GPUs');
    expect(fewestNodes(3, 4, [4, 8, 2])).toBe(2);
    expect(fewestNodes(5, 4, [4, 8, 2])).toBeNull();
  });

  test('replicas go into the request only above 1, only with whole GPUs', () => {
    expect(toRequest('d.ipynb', draft, [])).toEqual({ path: 'd.ipynb', project: 'vision', gpus: 8, replicas: 2, priority: 0 });
    expect(toRequest('d.ipynb', { ...draft, replicas: '1' }, []).replicas).toBeUndefined();
    expect(toRequest('d.ipynb', { ...draft, replicas: '' }, []).replicas).toBeUndefined();
    expect(() => toRequest('d.ipynb', { ...draft, gpus: '0.5' }, [])).toThrow(/need whole GPUs/);
    expect(() => toRequest('d.ipynb', { ...draft, gpus: '0' }, [])).toThrow(/need whole GPUs/);
    expect(parseReplicas('16')).toBe(16);
    for (const bad of ['0', '65', '1.5', 'two', '-2']) {
      expect(() => parseReplicas(bad)).toThrow(`Replicas must be a whole number from 1 to 64, not '${bad}'.`);
    }
  });

  test('each replica: its node and GPUs, in rank order', () => {
    const gpus = (node: string) =>
      [0, 1, 2, 3, 4, 5, 6, 7].map(i => ({ id: `${node}-${i}`, index: i, model: 'A100-80GB', milli: 1000, memory_limit: null }));
    const job = {
      id: 'j-1',
      request: { ...request, replicas: 2 },
      assignment: {
        node: 'node-a',
        gpus: [...gpus('node-a'), ...gpus('node-b')],
        replicas: [
          { rank: 0, node: 'node-a', gpus: gpus('node-a') },
          { rank: 1, node: 'node-b', gpus: gpus('node-b').filter(g => g.index !== 3) }
        ]
      }
    } as unknown as IJob;
    expect(formatReplicas(job)).toEqual([
      'replica 0 on node-a: GPUs 0–7 (A100-80GB)',
      'replica 1 on node-b: GPUs 0, 1, 2, 4, 5, 6, 7 (A100-80GB)'
    ]);
    expect(jobNodes(job)).toBe('node-a, node-b');
    // Finished: no GPUs held, the request still says what it was.
    expect(jobShare({ ...job, assignment: null } as IJob)).toBe(16);
  });
});

test.describe('project quotas', () => {
  const draft = { name: 'vision', build_quota: '1.5', train_guarantee: '2', train_limit: '', weight: '1' };

  test('become numbers of GPUs; an empty limit means none', () => {
    expect(toProjectUpdate(draft)).toEqual({ build_quota: 1.5, train_guarantee: 2, weight: 1, train_limit: null });
    expect(toProjectUpdate({ ...draft, train_limit: '3' }).train_limit).toBe(3);
  });

  test('refuse negative or missing numbers and odd names', () => {
    expect(() => toProjectUpdate({ ...draft, build_quota: '-1' })).toThrow(/Build quota/);
    expect(() => toProjectUpdate({ ...draft, weight: '' })).toThrow(/Weight/);
    expect(() => toProjectUpdate({ ...draft, name: 'a b' })).toThrow(/project name/);
  });
});
