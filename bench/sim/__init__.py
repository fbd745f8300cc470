"""A discrete-event replay of GPU training jobs against scheduling policies.

The simulator speaks the policy engine's own language: each scheduling cycle it
hands a :class:`gpupool.policy.Snapshot` to a ``schedule(snapshot) ->
Decisions`` function and carries out the decisions. The baselines (static
per-team partitions, pooled FIFO) are written as such functions too, so every
policy is measured by exactly the same accounting code.
"""
