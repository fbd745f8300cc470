"""The Kubernetes backend: the cluster's GPU nodes are the pool, each attempt of a training job is a Pod.

gpupool is the cluster's GPU scheduler (pods carry ``schedulerName:
gpupool``; we bind them with the ``pods/binding`` subresource), with the same
policy core as on one machine. One job per module:

- :mod:`.names`: the labels, annotations and names we read and write;
- :mod:`.connect`: an API client from a kubeconfig or the in-cluster account;
- :mod:`.watcher`: list + watch in a thread (re-list on 410, back off while unreachable), objects as JSON;
- :mod:`.objects`: reading those JSON objects (labels, phase, node, exit code, times);
- :mod:`.nodes`: a Node object -> the pool's view of it (pure);
- :mod:`.pods`: a launch -> a Pod manifest, and a Pod -> how its attempt ended (pure);
- :mod:`.disruption`: whether a Pod's end was someone else's doing (deleted, evicted), not its container's (pure);
- :mod:`.calls`: the blocking API calls, on a few worker threads, retried with backoff;
- :mod:`.executor`: :class:`PodExecutor`, the core's executor for pods;
- :mod:`.backend`: :class:`KubeBackend`, the core's backend (nodes + executor).
"""
