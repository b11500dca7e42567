"""Shared prompt prefixes of one view, computed once (:class:`PrefixPlan`, :class:`PrefixStore`).

Cases that offer the same tools share most of their prompt (the system turn with the tools, the
instruction, the examples). :class:`PrefixPlan` finds, over the token ids of every row of a view, the
prefixes worth computing once: the branch points of the prompts' token trie (the longest common prefix
of neighbours in sorted order, :func:`adjacent_lcps`) at least ``min_shared`` tokens deep. Each such
*node* is computed once, on top of its nearest shared ancestor; each row's prompt pass then runs only
its own suffix on top of its deepest node. A row's node is never its whole prompt: its last token is
always computed by its own pass (its logits are the row's first token).

:class:`PrefixStore` holds the nodes' KV (every layer's keys and values for the node's whole depth, one
contiguous ``[1, heads, depth, dim]`` tensor each), counts the rows that still need each node and drops
it once the last has had its prompt pass (bounded memory: rows are admitted in sorted order, so the
rows of a node come together).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


def adjacent_lcps(prompts: Sequence[Sequence[int]], order: Sequence[int]) -> list[int]:
    """Longest common prefix of each pair of neighbours in ``order`` (len(order) - 1 values)."""
    out = []
    for a, b in zip(order, order[1:]):
        x, y = prompts[a], prompts[b]
        n = min(len(x), len(y))
        k = 0
        while k < n and x[k] == y[k]:
            k += 1
        out.append(k)
    return out


@dataclass
class PrefixNode:
    """A shared prefix: ``depth`` tokens of the prompt of row ``row`` (any row under it has them)."""

    id: int
    depth: int
    row: int
    parent: int | None = None
    """The nearest shared node it extends (None: computed from the start)."""
    users: int = 0
    """Rows whose prompt pass starts from it, plus nodes computed on top of it."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.row, self.depth)


@dataclass
class PrefixPlan:
    """Which rows start from which shared node, and in what order rows are admitted."""

    nodes: dict[int, PrefixNode] = field(default_factory=dict)
    row_node: list[int | None] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    """Row indices in admission order: sorted by prompt, so the rows of a node come together."""
    prompt_tokens: int = 0
    """Prompt tokens of every row."""
    computed_tokens: int = 0
    """Prompt tokens computed with the plan: every node's own segment + every row's suffix."""
    prompts: Sequence[Sequence[int]] = ()
    views: Sequence[str | None] = ()
    """Each row's view in a joint run (empty: one view). A prefix is shared within a view only: an adapter's
    LoRA delta changes the prompt's keys and values."""

    def view_of(self, row: int) -> str | None:
        return self.views[row] if self.views else None

    @classmethod
    def build(cls, prompts: Sequence[Sequence[int]], rows: Sequence[int], min_shared: int = 16,
              views: Sequence[str | None] = ()) -> PrefixPlan:
        """The plan over rows ``rows`` of ``prompts``; ``views``: each row's view (a joint run), each view's rows
        planned on their own and admitted interleaved by prompt (a prompt's rows of every view together, so they
        share their passes' shapes)."""
        names = list(dict.fromkeys(views[i] for i in rows)) if views else []
        if len(names) > 1:
            return cls._joint(prompts, views, [cls.build(prompts, [i for i in rows if views[i] == name], min_shared)
                                               for name in names], names)
        plan = cls(row_node=[None] * len(prompts), prompts=prompts)
        order = sorted(rows, key=lambda i: list(prompts[i]))
        plan.order = order
        plan.prompt_tokens = sum(len(prompts[i]) for i in rows)
        lcps = adjacent_lcps(prompts, order)
        # each row's deepest shared prefix: the longer LCP with its two neighbours, never the whole prompt
        keys: dict[bytes, int] = {}
        depths: list[int] = []
        for pos, i in enumerate(order):
            left = lcps[pos - 1] if pos > 0 else 0
            right = lcps[pos] if pos < len(lcps) else 0
            deepest = min(max(left, right), len(prompts[i]) - 1)
            depths.append(deepest)
        # the trie's branch points: every adjacent LCP (and each row's own, capped, depth) deep enough
        candidates = [(order[pos], d) for pos, d in enumerate(lcps) if d >= min_shared]
        candidates += [(i, d) for i, d in zip(order, depths) if d >= min_shared]
        for row, depth in sorted(candidates, key=lambda c: c[1]):
            key = prefix_key(prompts[row], depth)
            if key not in keys:
                node = PrefixNode(id=len(plan.nodes), depth=depth, row=row)
                plan.nodes[node.id] = node
                keys[key] = node.id
        node_depths = sorted({n.depth for n in plan.nodes.values()})
        for node in plan.nodes.values():  # nearest shared ancestor: the deepest node that is a prefix of it
            for d in reversed([d for d in node_depths if d < node.depth]):
                parent = keys.get(prefix_key(prompts[node.row], d))
                if parent is not None:
                    node.parent = parent
                    plan.nodes[parent].users += 1
                    break
        for i, d in zip(order, depths):
            if d >= min_shared:
                node_id = keys[prefix_key(prompts[i], d)]
                plan.row_node[i] = node_id
                plan.nodes[node_id].users += 1
        # nodes no row starts from and no other node extends cost a pass and save nothing
        plan._prune()
        plan.computed_tokens = sum(n.depth - plan.depth(n.parent) for n in plan.nodes.values()) + sum(
            len(prompts[i]) - plan.depth(plan.row_node[i]) for i in rows)
        return plan

    @classmethod
    def _joint(cls, prompts: Sequence[Sequence[int]], views: Sequence[str | None], plans: list[PrefixPlan],
               names: list[str | None]) -> PrefixPlan:
        """One plan of the views' plans: their nodes renumbered, rows ordered by prompt, then view."""
        joint = cls(row_node=[None] * len(prompts), prompts=prompts, views=views)
        rank = {name: k for k, name in enumerate(names)}
        for plan in plans:
            ids = {old: len(joint.nodes) + k for k, old in enumerate(plan.nodes)}
            for old, node in plan.nodes.items():
                joint.nodes[ids[old]] = PrefixNode(id=ids[old], depth=node.depth, row=node.row,
                                                   parent=None if node.parent is None else ids[node.parent],
                                                   users=node.users)
            for i in plan.order:
                joint.row_node[i] = None if plan.row_node[i] is None else ids[plan.row_node[i]]
            joint.order += plan.order
            joint.prompt_tokens += plan.prompt_tokens
            joint.computed_tokens += plan.computed_tokens
        joint.order.sort(key=lambda i: (list(prompts[i]), rank[views[i]]))
        return joint

    def depth(self, node_id: int | None) -> int:
        return 0 if node_id is None else self.nodes[node_id].depth

    def _prune(self) -> None:
        while True:
            idle = [n for n in self.nodes.values() if n.users == 0]
            if not idle:
                return
            for node in idle:
                del self.nodes[node.id]
                if node.parent is not None:
                    self.nodes[node.parent].users -= 1


def prefix_key(prompt: Sequence[int], depth: int) -> bytes:
    import array

    return array.array("q", prompt[:depth]).tobytes()


class PrefixStore:
    """The KV of computed nodes, dropped once no row or node still needs them."""

    def __init__(self, plan: PrefixPlan) -> None:
        self.plan = plan
        self.kv: dict[int, list[tuple[Any, Any]]] = {}
        self.users = {n.id: n.users for n in plan.nodes.values()}
        self.peak_tokens = 0
        """Most node tokens held at once (a bound on the store's memory)."""

    def __contains__(self, node_id: int) -> bool:
        return node_id in self.kv

    def put(self, node_id: int, layers: list[tuple[Any, Any]]) -> None:
        self.kv[node_id] = layers
        self.peak_tokens = max(self.peak_tokens, sum(self.plan.nodes[n].depth for n in self.kv))
        parent = self.plan.nodes[node_id].parent
        if parent is not None:
            self.release(parent)

    def get(self, node_id: int) -> list[tuple[Any, Any]]:
        return self.kv[node_id]

    def release(self, node_id: int) -> None:
        """One user of the node is done with it (a row's prompt pass ran, or a child node was computed)."""
        self.users[node_id] -= 1
        if self.users[node_id] <= 0:
            self.kv.pop(node_id, None)
