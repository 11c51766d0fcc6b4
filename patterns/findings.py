"""What the attention and MLP raises report per block: a typed finding with a status.

In: a pass's decision about one block. Out: `BlockFinding` — the block's nodes, its status
(found, raised, or refused with the reason), the target kernel, a label (the attention
variant or the MLP activation) and idiom-specific details; `to_json` gives the report's keys
(DESIGN.md: attention `nodes, variant, target, reason`; MLP `nodes, activation, target`),
`describe` the one line `--annotate` and `--localize` show. A finding also reads like the
dict it serialises to (a Mapping), so code that looks keys up keeps working.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


class Status(enum.StrEnum):
    FOUND = "found"  # matched, not yet decided
    RAISED = "raised"
    REFUSED = "refused"


class Idiom(enum.StrEnum):
    ATTENTION = "attention"
    MLP = "mlp"


_LABEL_KEY = {Idiom.ATTENTION: "variant", Idiom.MLP: "activation"}
_BASE_KEYS = {"nodes", "target", "reason", "status", "variant", "activation"}


@dataclass(frozen=True, slots=True)
class BlockFinding(Mapping):
    idiom: Idiom
    nodes: tuple[str, ...]
    status: Status
    label: str | None = None
    target: str | None = None
    reason: str | None = None
    details: tuple[tuple[str, object], ...] = ()

    @staticmethod
    def of(
        idiom: Idiom,
        nodes,
        label: str | None,
        target: str | None = None,
        reason: str | None = None,
        status: Status | None = None,
        **details: object,
    ) -> BlockFinding:
        if status is None:
            status = Status.RAISED if target else Status.REFUSED if reason else Status.FOUND
        return BlockFinding(
            idiom, tuple(nodes), status, label, target, reason, tuple(details.items())
        )

    def to_json(self) -> dict:
        doc = {
            "nodes": list(self.nodes),
            _LABEL_KEY[self.idiom]: self.label,
            "target": self.target,
            "reason": self.reason,
            "status": str(self.status),
        }
        doc.update(self.details)
        return doc

    @staticmethod
    def from_json(idiom: Idiom, doc: Mapping) -> BlockFinding:
        details = {k: v for k, v in doc.items() if k not in _BASE_KEYS}
        status = doc.get("status") or ("raised" if doc.get("target") else "refused")
        return BlockFinding.of(
            idiom,
            doc.get("nodes") or (),
            doc.get(_LABEL_KEY[idiom]),
            doc.get("target"),
            doc.get("reason"),
            Status(status),
            **details,
        )

    def describe(self) -> str:
        """`attention (<variant>): raised to <target>` or `…: not raised: <reason>`."""
        label = self.label or ("plain" if self.idiom is Idiom.ATTENTION else "-")
        if self.status is Status.RAISED:
            outcome = f"raised to {self.target}"
        elif self.status is Status.REFUSED:
            outcome = f"not raised: {self.reason}"
        else:
            outcome = "found"
        return f"{self.idiom} ({label}): {outcome}"

    # --- Mapping: the finding reads like its JSON --------------------------------------------
    def __getitem__(self, key: str) -> object:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


def describe_blocks(records) -> dict[str, str]:
    """Node → the one-line description of the attention or MLP block it belongs to, from the
    pass records of a compilation (the same text `--annotate` writes)."""
    out = {}
    for record in records:
        for finding in record.result.findings:
            if isinstance(finding, BlockFinding) and finding.get("is_attention", True):
                out.update(dict.fromkeys(finding.nodes, finding.describe()))
    return out
