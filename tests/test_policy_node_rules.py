"""Node placement rules (issue 24, item 2): the matcher, and the policy placing only where rules allow.

A pod's nodeSelector, required node affinity and tolerations decide which
nodes it may run on; preferred affinity and PreferNoSchedule taints only
weigh. Each test here fails when the policy ignores the rule it names.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from test_policy_helpers import gang, node, on, project, snap, train

from gpupool.policy import schedule
from gpupool.policy.model import Node, Request, Workload
from gpupool.policy.node_rules import Expr, NodeRules, Taint, Toleration, allows, soft_score

INFERENCE = Taint("dedicated", "inference", "NoSchedule")
TOLERATES_INFERENCE = (Toleration("dedicated", "Equal", "inference", "NoSchedule"),)


def labelled(n: Node, taints: tuple[Taint, ...] = (), **labels: str) -> Node:
    return dataclasses.replace(n, labels=tuple(sorted(labels.items())), taints=taints)


def ruled(w: Workload, rules: NodeRules) -> Workload:
    return dataclasses.replace(w, request=dataclasses.replace(w.request, rules=rules))


def selector(**labels: str) -> NodeRules:
    return NodeRules(selector=tuple(sorted(labels.items())))


def nodes_of(d) -> dict[str, str]:
    return {s.workload_id: s.assignment.node for s in d.starts}


def reasons_of(d) -> dict[str, str]:
    return {x.workload_id: x.reason for x in (*d.waits, *d.rejects)}


# ------------------------------------------------------------------ the matcher


def test_expressions_follow_kubernetes_operators():
    labels = {"gpu": "h100", "mem": "80"}
    assert Expr("gpu", "In", ("h100", "a100")).matches(labels)
    assert not Expr("gpu", "In", ("a100",)).matches(labels)
    assert not Expr("zone", "In", ("a",)).matches(labels)
    assert Expr("gpu", "NotIn", ("a100",)).matches(labels)
    assert Expr("zone", "NotIn", ("a",)).matches(labels)  # an absent label is not in any set
    assert Expr("gpu", "Exists").matches(labels) and not Expr("zone", "Exists").matches(labels)
    assert Expr("zone", "DoesNotExist").matches(labels) and not Expr("gpu", "DoesNotExist").matches(labels)
    assert Expr("mem", "Gt", ("40",)).matches(labels) and not Expr("mem", "Gt", ("80",)).matches(labels)
    assert Expr("mem", "Lt", ("81",)).matches(labels) and not Expr("mem", "Lt", ("80",)).matches(labels)
    assert not Expr("gpu", "Gt", ("1",)).matches(labels)  # not a number: no match
    assert not Expr("zone", "Lt", ("1",)).matches(labels)


def test_terms_are_ored_and_expressions_anded():
    rules = NodeRules(required=((Expr("gpu", "In", ("h100",)), Expr("zone", "In", ("a",))),
                                (Expr("gpu", "In", ("a100",)),)))
    assert rules.allows_labels({"gpu": "h100", "zone": "a"})
    assert not rules.allows_labels({"gpu": "h100", "zone": "b"})
    assert rules.allows_labels({"gpu": "a100"})
    assert not NodeRules(required=((),)).allows_labels({"gpu": "h100"})  # an empty term matches nothing
    both = NodeRules(selector=(("pool", "x"),), required=((Expr("gpu", "Exists"),),))
    assert both.allows_labels({"pool": "x", "gpu": "1"}) and not both.allows_labels({"gpu": "1"})


def test_tolerations_match_taints_like_kubernetes():
    t = INFERENCE
    assert Toleration("dedicated", "Equal", "inference", "NoSchedule").tolerates(t)
    assert Toleration("dedicated", "Equal", "inference").tolerates(t)  # no effect: every effect
    assert not Toleration("dedicated", "Equal", "training").tolerates(t)
    assert Toleration("dedicated", "Exists").tolerates(t)
    assert Toleration("", "Exists").tolerates(t)  # empty key with Exists: every taint
    assert not Toleration("", "Equal").tolerates(t)
    assert not Toleration("dedicated", "Exists", effect="NoExecute").tolerates(t)
    assert not allows(None, {}, (t,))
    assert allows(None, {}, (Taint("x", "", "PreferNoSchedule"),))  # only weighs
    assert not allows(NodeRules(), {}, (Taint("x", "", "NoExecute"),))
    assert allows(NodeRules(tolerations=TOLERATES_INFERENCE), {}, (t,))


def test_soft_score_weighs_preferences_and_prefer_no_schedule():
    rules = NodeRules(preferred=((30, (Expr("gpu", "In", ("h100",)),)), (5, (Expr("zone", "Exists"),))))
    assert soft_score(rules, {"gpu": "h100", "zone": "a"}, ()) == 35
    assert soft_score(rules, {"gpu": "a100"}, ()) == 0
    assert soft_score(None, {}, (Taint("x", "", "PreferNoSchedule"),)) < 0


_key = st.sampled_from(["gpu", "zone", "pool"])
_val = st.sampled_from(["a", "b", "1", "7"])
_labels = st.dictionaries(_key, _val, max_size=3)
_expr = st.builds(Expr, _key, st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
                  st.lists(_val, min_size=1, max_size=2).map(tuple))


@given(_labels, st.lists(st.lists(_expr, max_size=3).map(tuple), min_size=1, max_size=3).map(tuple))
def test_required_affinity_is_an_or_of_ands(labels, terms):
    rules = NodeRules(required=terms)
    assert rules.allows_labels(labels) == any(t and all(e.matches(labels) for e in t) for t in terms)
    # NotIn is the negation of In, DoesNotExist of Exists
    for e in (x for t in terms for x in t):
        if e.operator in ("In", "NotIn"):
            other = Expr(e.key, "NotIn" if e.operator == "In" else "In", e.values)
            assert e.matches(labels) != other.matches(labels)


@given(_labels, st.dictionaries(_key, _val, max_size=2))
def test_a_selector_matches_exactly_the_nodes_carrying_its_labels(labels, wanted):
    rules = NodeRules(selector=tuple(sorted(wanted.items())))
    assert rules.allows_labels(labels) == all(labels.get(k) == v for k, v in wanted.items())


# ------------------------------------------------------------------ placement


def _two_nodes(taint_b: tuple[Taint, ...] = ()) -> tuple[Node, Node]:
    return labelled(node("node-a"), gpu="a100", zone="x"), labelled(node("node-b"), taint_b, gpu="h100", zone="y")


def test_a_node_selector_places_only_on_matching_nodes():
    a, b = _two_nodes()
    # node-a comes first and is where the job would go without its selector
    assert nodes_of(schedule(snap([a, b], [project("p", 8)], [train("j", "p")]))) == {"j": "node-a"}
    d = schedule(snap([a, b], [project("p", 8)], [ruled(train("j", "p"), selector(gpu="h100"))]))
    assert nodes_of(d) == {"j": "node-b"}


def test_required_affinity_places_only_on_matching_nodes():
    a, b = _two_nodes()
    rules = NodeRules(required=((Expr("gpu", "In", ("h100", "v100")),), (Expr("zone", "In", ("z",)),)))
    notin = NodeRules(required=((Expr("gpu", "NotIn", ("a100",)),),))
    d = schedule(snap([a, b], [project("p", 8)], [ruled(train("j", "p"), rules), ruled(train("n", "p"), notin)]))
    assert nodes_of(d) == {"j": "node-b", "n": "node-b"}


def test_a_tainted_node_takes_only_work_that_tolerates_it():
    a, b = _two_nodes((INFERENCE,))
    ws = [train(f"j{i}", "p", t=990 + i) for i in range(6)] + [ruled(train("tol", "p", t=999), NodeRules(
        tolerations=TOLERATES_INFERENCE))]
    d = schedule(snap([a, b], [project("p", 8)], ws))
    placed = nodes_of(d)
    assert [placed[f"j{i}"] for i in range(4)] == ["node-a"] * 4
    assert "j4" not in placed and "j5" not in placed
    assert placed["tol"] == "node-b"
    assert reasons_of(d)["j4"].startswith("no room for 1 whole GPU on the train pool: the only node with room is "
                                          "tainted dedicated=inference:NoSchedule, which the job does not tolerate")


def test_no_execute_taints_repel_and_prefer_no_schedule_only_weighs():
    a, b = _two_nodes((Taint("maint", "", "NoExecute"),))
    d = schedule(snap([b, a], [project("p", 8)], [train("j", "p")]))
    assert nodes_of(d) == {"j": "node-a"}
    a, b = _two_nodes((Taint("spot", "", "PreferNoSchedule"),))
    d = schedule(snap([b, a], [project("p", 8)], [train("j", "p")]))
    assert nodes_of(d) == {"j": "node-a"}  # node-b comes first, but would rather not
    full_a = labelled(node("node-a", gpus=1), gpu="a100")
    d = schedule(snap([b, full_a], [project("p", 8)], [train("j", "p", gpus=2)]))
    assert nodes_of(d) == {"j": "node-b"}  # PreferNoSchedule never keeps work waiting


def test_preferred_affinity_breaks_ties_only():
    a, b = _two_nodes()
    prefer_b = NodeRules(preferred=((50, (Expr("gpu", "In", ("h100",)),)),))
    d = schedule(snap([a, b], [project("p", 8)], [ruled(train("j", "p"), prefer_b)]))
    assert nodes_of(d) == {"j": "node-b"}
    # a node already partly used packs better: the preference does not undo packing
    busy = on(train("r", "p"), "node-a", 0)
    d = schedule(snap([a, b], [project("p", 8)], [busy, ruled(train("j", "p"), prefer_b)]))
    assert nodes_of(d) == {"j": "node-a"}


def test_what_no_node_could_ever_hold_says_which_rule():
    a, b = _two_nodes((INFERENCE,))
    ws = [ruled(train("v", "p"), selector(gpu="v100")),
          ruled(train("h", "p"), selector(gpu="h100")),
          ruled(train("big", "p", gpus=8), selector(gpu="h100"))]
    d = schedule(snap([a, b], [project("p", 8)], ws))
    why = reasons_of(d)
    assert why["v"] == "no node of the train pool matches nodeSelector gpu=v100"
    assert why["h"] == ("the only node of the train pool that matches nodeSelector gpu=h100 is tainted "
                        "dedicated=inference:NoSchedule, which the job does not tolerate")
    assert why["big"].startswith("no node of the train pool can ever hold 8 whole GPUs")  # size, not rules
    d = schedule(snap([a, b], [project("p", 8)], ws[:1], elastic_pool=True))
    assert reasons_of(d)["v"] == ("no node of the train pool matches nodeSelector gpu=v100 now; it waits for "
                                  "such a node to join the pool")
    assert not d.rejects


def test_a_selector_waits_for_room_on_matching_nodes_and_says_so():
    a, b = _two_nodes()
    ws = [ruled(train(f"j{i}", "p", t=990 + i), selector(gpu="h100")) for i in range(5)]
    d = schedule(snap([a, b], [project("p", 8)], ws))
    assert set(nodes_of(d).values()) == {"node-b"} and len(d.starts) == 4
    assert reasons_of(d)["j4"].startswith("no room for 1 whole GPU on the train pool: the only node with room "
                                          "does not match nodeSelector gpu=h100")


def test_a_gang_with_a_selector_uses_only_matching_nodes():
    nodes = [labelled(node(f"n{i}"), gpu="h100" if i % 2 else "a100") for i in range(4)]
    g = [ruled(w, selector(gpu="h100")) for w in gang("g", "p", 2, 4)]
    d = schedule(snap(nodes, [project("p", 16)], g))
    assert sorted(nodes_of(d).values()) == ["n1", "n3"]
    g3 = [ruled(w, selector(gpu="h100")) for w in gang("g3", "p", 3, 4)]
    d = schedule(snap(nodes, [project("p", 16)], g3))
    assert not d.starts
    assert all("match nodeSelector gpu=h100" in r.reason for r in d.rejects)


def test_reclaim_frees_room_only_where_the_claimant_may_run():
    a, b = _two_nodes()
    running = [on(train(f"r{i}", "over", t=0), "node-a" if i < 4 else "node-b", i % 4) for i in range(8)]
    claimant = ruled(train("c", "under", t=1), selector(gpu="h100"))
    s = snap([a, b], [project("over", 0), project("under", 4)], [*running, claimant])
    d = schedule(s)
    paused = {p.workload_id for p in d.preempts}
    assert paused and paused <= {"r4", "r5", "r6", "r7"}  # the victims ran on node-b, where the claimant may go
    assert nodes_of(d) == {"c": "node-b"}


def test_nothing_changes_without_labels_or_rules():
    a, b = node("node-a"), node("node-b")
    ws = [train(f"j{i}", "p", t=i) for i in range(6)]
    plain = schedule(snap([a, b], [project("p", 8)], ws))
    with_empty_rules = schedule(snap([a, b], [project("p", 8)], [ruled(w, NodeRules()) for w in ws]))
    assert nodes_of(plain) == nodes_of(with_empty_rules)
    assert Request().rules is None
