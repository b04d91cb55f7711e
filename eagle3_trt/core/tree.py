"""Static draft trees (EAGLE "choices" lists) and the attention masks they imply.

A tree is a list of paths of sibling ranks: ``(0,)`` is the draft's top-1 token after the root,
``(1,)`` its top-2, ``(0, 0)`` the top-1 continuation of ``(0,)`` and so on. A chain of K draft
tokens is the tree ``[(0,), (0, 0), ..., (0,)*K]``; the runtime treats chains as this special
case so that chain and tree decoding share one code path.

Node indices are 0-based over the tree (the root, i.e. the last accepted token, is not a node);
nodes are ordered by depth, then by path, so every parent comes before its children.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from eagle3_trt.errors import UserError
from eagle3_trt.formats.tree_choices import choices_from_json


@dataclass(frozen=True)
class DraftTree:
    paths: tuple[tuple[int, ...], ...]  # one per node, sorted by (depth, path)
    parent: tuple[int, ...]  # node index of the parent, -1 for depth-1 nodes (children of the root)
    depth: tuple[int, ...]  # 1-based
    rank: tuple[int, ...]  # the node's token is the rank-th most likely draft token after its parent

    @classmethod
    def chain(cls, k: int) -> DraftTree:
        return cls.from_choices([(0,) * d for d in range(1, k + 1)])

    @classmethod
    def from_choices(cls, choices: Iterable[Any]) -> DraftTree:
        paths = []
        for c in choices:
            try:
                p = tuple(int(x) for x in c)
            except (TypeError, ValueError):
                raise UserError("tree", f"choice {c!r} is not a sequence of integers", "write choices like [[0], [1], [0, 0]]") from None
            if not p or min(p) < 0:
                raise UserError("tree", f"choice {c!r} must be a non-empty path of ranks >= 0", "write choices like [[0], [1], [0, 0]]")
            paths.append(p)
        if len(set(paths)) != len(paths):
            raise UserError("tree", "duplicate paths in the choices list", "list each tree node once")
        have = set(paths)
        for p in paths:
            if len(p) > 1 and p[:-1] not in have:
                raise UserError("tree", f"path {list(p)} has no parent {list(p[:-1])} in the choices list", "every prefix of a path must be a node too")
        paths.sort(key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(paths)}
        parent = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)
        return cls(tuple(paths), parent, tuple(len(p) for p in paths), tuple(p[-1] for p in paths))

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    @property
    def is_chain(self) -> bool:
        return all(r == 0 for r in self.rank) and len(set(self.depth)) == len(self.depth)

    def __post_init__(self) -> None:
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parent):
            kids.setdefault(p, []).append(i)
        object.__setattr__(self, "_kids", {p: sorted(v, key=lambda i: self.rank[i]) for p, v in kids.items()})

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in rank order."""
        kids: dict[int, list[int]] = self._kids  # type: ignore[attr-defined]
        return kids.get(node, [])

    def max_rank_after(self, node: int) -> int:
        """How many top draft tokens are needed after ``node`` (-1 = root)."""
        return max((self.rank[c] + 1 for c in self.children(node)), default=0)

    def expanded(self, max_depth: int) -> list[int]:
        """Nodes whose children are drafted within ``max_depth``: the draft runs a query for each."""
        return [i for i in range(self.size) if self.depth[i] < max_depth and self.children(i)]

    def ancestors(self) -> torch.Tensor:
        """[T, T] bool: node i may attend to node j (j is i or an ancestor of i)."""
        a = torch.zeros(self.size, self.size, dtype=torch.bool)
        for i in range(self.size):
            j = i
            while j >= 0:
                a[i, j] = True
                j = self.parent[j]
        return a


def parse_tree(spec: Any) -> DraftTree | None:
    """None, a DraftTree, or a choices list (possibly as JSON text)."""
    if spec is None or isinstance(spec, DraftTree):
        return spec
    if isinstance(spec, str):
        spec = choices_from_json(spec)
    return DraftTree.from_choices(spec)
