"""Patterns written as the ops they match, in the style of the onnxscript rewriter.

In: a function that calls ops on a `PatternOps` — `op.MatMul(a, b, key="qk")`,
`op.any_of("Mul", "Div")(s, key="scale")`, and `op.choose(n)` where the pattern has
alternatives (an optional node is `choose(2)`, a run of 0..k repeated nodes `choose(k + 1)`).
Out: `expand`, one `matcher.Pattern` per combination of choices, largest first (the most
specific pattern wins when several match; equal sizes keep the order the choices are written,
option 0 first), ready for the networkx matcher.

An input given as None is a wildcard: any producer, or none (a graph input or a constant);
it adds no pattern node. Inputs are positional — the edge names the consumer's input index —
unless the node is built with `commutative=True`, whose inputs match at any index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from onnx2bir.patterns.matcher import ANY_INDEX, Pattern, PNode


@dataclass
class PatternOps:
    """The ops a pattern function calls; `prefix` fixes its first choices."""

    prefix: tuple[int, ...] = ()
    nodes: list[PNode] = field(default_factory=list)
    edges: list[tuple[str, str, int]] = field(default_factory=list)
    trace: list[tuple[int, int]] = field(default_factory=list)  # (taken, options) per choice
    tags: list[str] = field(default_factory=list)  # words naming this variant

    def tag(self, text: str) -> None:
        self.tags.append(text)

    def choose(self, options: int) -> int:
        """Which of `options` alternatives this variant takes."""
        index = len(self.trace)
        taken = self.prefix[index] if index < len(self.prefix) else 0
        self.trace.append((taken, options))
        return taken

    def any_of(self, *op_types: str) -> Callable[..., str]:
        def node(*inputs: str | None, key: str, commutative: bool = False, check=None) -> str:
            if any(n.key == key for n in self.nodes):
                raise ValueError(f"pattern node {key!r} is defined twice")
            self.nodes.append(PNode.of(key, *op_types, check=check))
            for index, value in enumerate(inputs):
                if value is not None:
                    self.edges.append((value, key, ANY_INDEX if commutative else index))
            return key

        return node

    def __getattr__(self, op_type: str) -> Callable[..., str]:
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return self.any_of(op_type)


def expand(name: str, build: Callable[[PatternOps], str]) -> list[Pattern]:
    """Every variant of the pattern `build` writes (it returns the anchor's key)."""
    patterns: list[tuple[tuple[int, ...], Pattern]] = []
    pending: list[tuple[int, ...]] = [()]
    while pending:
        prefix = pending.pop()
        ops = PatternOps(prefix)
        anchor = build(ops)
        taken = tuple(t for t, _ in ops.trace)
        for position in range(len(prefix), len(ops.trace)):
            for other in range(1, ops.trace[position][1]):
                pending.append((*taken[:position], other))
        label = ", ".join(ops.tags) or ",".join(map(str, taken))
        patterns.append(
            (taken, Pattern(f"{name}[{label}]", tuple(ops.nodes), tuple(ops.edges), anchor))
        )
    # Largest first; among equal sizes, in the order the choices are written.
    return [p for _, p in sorted(patterns, key=lambda item: (-item[1].size, item[0]))]
