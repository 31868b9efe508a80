"""Selection policies: the paper's Figure 3 example, prefix closure, a brute-force reference, errors; batches."""

import random

import pytest

from ecospec.selection import select, select_batch

POLICIES = ("confidence", "global_cost", "ecospec", "oracle")  # docs/design.md, "Selection rules"

N_EXPERTS = 16


def figure3():
    root = {(0, 1), (0, 2), (0, 3), (0, 4)}
    experts = [{(0, 1), (0, 5), (0, 6), (0, 7)}, {(0, 2), (0, 3), (0, 8), (0, 9)}]
    return [-1, -1], [0.53, 0.40], experts, root


def to_int(pairs):
    return sum(1 << (layer * N_EXPERTS + e) for layer, e in pairs)


def random_tree(rng, n, ties=False):
    """Random tree; P is the product of child probs along the path (or drawn from a few values)."""
    parents, probs, experts = [], [], []
    pool = [frozenset((rng.randrange(2), rng.randrange(N_EXPERTS)) for _ in range(3)) for _ in range(3)]
    for i in range(n):
        p = rng.randrange(-1, i)
        parents.append(p)
        if ties:
            probs.append(rng.choice([0.5, 0.25, 0.25, 0.125]))
            experts.append(rng.choice(pool))
        else:
            probs.append(rng.random() * (probs[p] if p >= 0 else 1.0))
            experts.append(frozenset((rng.randrange(3), rng.randrange(N_EXPERTS)) for _ in range(4)))
    root = frozenset((rng.randrange(3), rng.randrange(N_EXPERTS)) for _ in range(rng.randrange(6)))
    return parents, probs, experts, root


def reference(policy, parents, probs, experts, budget, root, eps=1e-6):
    """Straightforward frontier greedy with Python sets, rescoring every candidate each step."""
    n = len(parents)

    def path(i):
        out = []
        while i >= 0:
            out.append(i)
            i = parents[i]
        return out

    traj = [set().union(*(experts[j] for j in path(i))) for i in range(n)]
    depth = [len(path(i)) for i in range(n)]
    chosen, buf = [], set(root)
    for _ in range(min(budget, n)):
        cands = [i for i in range(n) if i not in chosen and (parents[i] < 0 or parents[i] in chosen)]
        if policy == "global_cost":
            score = {i: probs[i] / (len(traj[i]) + eps) for i in cands}
        else:
            score = {i: probs[i] / (len(traj[i] - buf) + eps) for i in cands}
        best = sorted(cands, key=lambda i: (-score[i], -probs[i], depth[i], i))[0]
        chosen.append(best)
        buf |= traj[best]
    return sorted(chosen)


def is_prefix_closed(parents, chosen):
    s = set(chosen)
    return all(parents[i] < 0 or parents[i] in s for i in chosen)


def test_figure3_example():
    parents, probs, experts, root = figure3()
    assert select("ecospec", parents, probs, experts, 1, root) == [1]
    assert select("oracle", parents, probs, experts, 1, root) == [1]
    assert select("confidence", parents, probs, None, 1) == [0]
    assert select("global_cost", parents, probs, experts, 1, root) == [0]
    ints = [to_int(e) for e in experts]
    assert select("ecospec", parents, probs, ints, 1, to_int(root)) == [1]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_prefix_closed_size_and_input_kinds(policy, ties):
    rng = random.Random(2 * POLICIES.index(policy) + ties)
    for _ in range(200):
        n = rng.randrange(1, 25)
        parents, probs, experts, root = random_tree(rng, n, ties)
        budget = rng.randrange(0, n + 4)
        got = select(policy, parents, probs, experts, budget, root)
        assert got == sorted(set(got))
        assert len(got) == min(max(budget, 0), n)
        assert is_prefix_closed(parents, got)
        ints = [to_int(e) for e in experts]
        assert select(policy, parents, probs, ints, budget, to_int(root)) == got
        assert select(policy, parents, probs, [list(e) for e in experts], budget, list(root)) == got


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("policy", ["ecospec", "oracle", "global_cost"])
def test_matches_brute_force(policy, ties):
    rng = random.Random(7 if ties else 3)
    for _ in range(300):
        n = rng.randrange(1, 20)
        parents, probs, experts, root = random_tree(rng, n, ties)
        budget = rng.randrange(1, n + 2)
        ref = reference(policy, parents, probs, experts, budget, root)
        assert select(policy, parents, probs, experts, budget, root) == ref
        assert select(policy, parents, probs, [to_int(e) for e in experts], budget, to_int(root)) == ref


def test_confidence_equals_top_budget_by_p():
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randrange(1, 30)
        parents, probs, depth = [], [], []
        for i in range(n):
            p = rng.randrange(-1, i)
            parents.append(p)
            depth.append(1 if p < 0 else depth[p] + 1)
            up = probs[p] if p >= 0 else 1.0
            probs.append(up * rng.choice([1.0, 0.5, 0.5, 0.25]))  # child P <= parent P, many ties
        budget = rng.randrange(1, n + 1)
        top = sorted(sorted(range(n), key=lambda i: (-probs[i], depth[i], i))[:budget])
        assert select("confidence", parents, probs, None, budget) == top


def test_budget_edges():
    parents, probs, experts, root = figure3()
    for policy in POLICIES:
        assert select(policy, parents, probs, experts, 0, root) == []
        assert select(policy, parents, probs, experts, -3, root) == []
        assert select(policy, parents, probs, experts, 5, root) == [0, 1]
        assert select(policy, [], [], [], 3) == []


def test_zero_new_experts_wins():
    # A deep low-P node whose trajectory is already buffered beats a fresh high-P sibling.
    parents, probs = [-1, -1, 0], [0.6, 0.3, 0.1]
    experts = [0b1, 0b110, 0b0]
    assert select("ecospec", parents, probs, experts, 2, root_experts=0b1) == [0, 2]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("greedy", [-1], [0.5], [1], 1), "unknown policy 'greedy'; allowed: confidence, chain, global_cost"),
        (("ecospec", [-1, 0], [0.5], [1, 2], 1), "len\\(probs\\)"),
        (("ecospec", [-1, 0], [0.5, 0.2], [1], 1), "len\\(experts\\)"),
        (("ecospec", [-1, 1], [0.5, 0.2], [1, 2], 1), "parents\\[1\\] = 1"),
        (("ecospec", [-1, 3, 0], [0.5, 0.2, 0.1], [1, 2, 3], 1), "parents\\[1\\] = 3"),
        (("ecospec", [-2], [0.5], [1], 1), "parents\\[0\\] = -2"),
        (("ecospec", [-1], [0.5], None, 1), "needs an expert set"),
        (("global_cost", [-1, 0], [0.5, 0.2], [1, None], 1), "needs an expert set"),
        (("oracle", [-1], [0.5], [1], 1, {(0, 1)}), "mix int bitmasks"),
    ],
)
def test_errors(args, match):
    with pytest.raises(ValueError, match=match):
        select(*args)


# -- batches (docs/design.md, "Batches") ---------------------------------------------------------------------------


def reference_shared(parents, probs, experts, budgets, roots, eps=1e-6):
    """The batch-shared buffer rule, straight from the text: Python sets, every candidate rescored each step."""

    def path(s, i):
        out = []
        while i >= 0:
            out.append(i)
            i = parents[s][i]
        return out

    traj = [
        [set().union(*(experts[s][j] for j in path(s, i))) for i in range(len(parents[s]))] for s in range(len(parents))
    ]
    depth = [[len(path(s, i)) for i in range(len(parents[s]))] for s in range(len(parents))]
    buf = set().union(*roots)
    chosen = [[] for _ in parents]
    while True:
        cands = [
            (s, i)
            for s in range(len(parents))
            if len(chosen[s]) < budgets[s]
            for i in range(len(parents[s]))
            if i not in chosen[s] and (parents[s][i] < 0 or parents[s][i] in chosen[s])
        ]
        if not cands:
            return [sorted(c) for c in chosen]

        score = {(s, i): probs[s][i] / (len(traj[s][i] - buf) + eps) for s, i in cands}
        s, i = min(cands, key=lambda c: (-score[c], -probs[c[0]][c[1]], depth[c[0]][c[1]], c[0], c[1]))
        chosen[s].append(i)
        buf |= traj[s][i]


def random_batch(rng, ties):
    trees = [random_tree(rng, rng.randrange(0, 12), ties) for _ in range(rng.randrange(1, 5))]
    return [list(x) for x in zip(*trees, strict=True)]  # parents, probs, experts, roots: each a list over sequences


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_select_batch_per_sequence_is_select(policy, ties):
    rng = random.Random(11 + 2 * POLICIES.index(policy) + ties)
    for _ in range(100):
        parents, probs, experts, roots = random_batch(rng, ties)
        budgets = [rng.randrange(0, 6) for _ in parents]
        want = [select(policy, *a) for a in zip(parents, probs, experts, budgets, roots, strict=True)]
        assert select_batch(policy, parents, probs, experts, budgets, roots) == want
        if policy in ("confidence", "global_cost"):  # no buffer: per sequence either way
            assert select_batch(policy, parents, probs, experts, budgets, roots, shared_buffer=True) == want


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("policy", ["ecospec", "oracle"])
def test_select_batch_shared_buffer_matches_the_rule(policy, ties):
    rng = random.Random(5 + ties)
    for _ in range(300):
        parents, probs, experts, roots = random_batch(rng, ties)
        budgets = [rng.randrange(0, 6) for _ in parents]
        got = select_batch(policy, parents, probs, experts, budgets, roots, shared_buffer=True)
        assert got == reference_shared(parents, probs, experts, budgets, roots)
        for par, chosen, b in zip(parents, got, budgets, strict=True):
            assert len(chosen) == min(b, len(par)) and is_prefix_closed(par, chosen)
        ints = [[to_int(e) for e in ex] for ex in experts]
        assert (
            select_batch(policy, parents, probs, ints, budgets, [to_int(r) for r in roots], shared_buffer=True) == got
        )
        if len(parents) == 1:  # one sequence: the batch rule is select's
            assert got == [select(policy, parents[0], probs[0], experts[0], budgets[0], roots[0])]


def test_select_batch_an_expert_loaded_for_another_sequence_is_free():
    # sequence 0's root loads expert 1; sequence 1's two candidates: 0.5 needing {2}, 0.4 needing {1}
    parents, probs = [[-1], [-1, -1]], [[0.9], [0.5, 0.4]]
    experts = [[{(0, 3)}], [{(0, 2)}, {(0, 1)}]]
    roots = [{(0, 1)}, set()]
    assert select_batch("ecospec", parents, probs, experts, [0, 1], roots, shared_buffer=True) == [[], [1]]
    assert select_batch("ecospec", parents, probs, experts, [0, 1], roots) == [[], [0]]  # per sequence
    # a node sequence 0 picks first (0.9 / 1) makes {3} free for sequence 1
    experts = [[{(0, 3)}], [{(0, 2)}, {(0, 3)}]]
    assert select_batch("ecospec", parents, probs, experts, 1, [set(), set()], shared_buffer=True) == [[0], [1]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"probs": [[0.5]]}, "probs has 1 sequences, parents 2"),
        ({"budget": [1]}, "budget has 1 sequences"),
        ({"experts": [[1], [{(0, 1)}]]}, "mix int bitmasks"),
    ],
)
def test_select_batch_errors(kwargs, match):
    args = {"parents": [[-1], [-1]], "probs": [[0.5], [0.5]], "experts": [[{(0, 1)}], [{(0, 2)}]], "budget": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        select_batch("ecospec", **args, root_experts=None, shared_buffer=True)
