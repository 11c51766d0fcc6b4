"""The memory planner's decisions in `report` (docs/memory_planner.md#report).

JSON, under "memory" (null when code generation failed):

    {"planned": bool, "resident": n, "dram": n,
     "sbuf_high_water_bytes", "psum_high_water_bytes",   (per partition; null when not planned)
     "allocation_order",         (the order the homes were placed in; docs/memory_planner.md
                                  #allocation; null when not planned)
     "dram_reasons": [{"reason", "count"}],              (most common first)
     "tensors": [{"tensor", "resident", "reason", "bytes_per_partition",
                  "first_item", "last_item"}],
     "shared_weights": [{"constant", "home", "readers", "bytes_per_partition",
                         "first_item", "last_item"}],              (docs/memory_planner.md
     "shared_weights_refused": [{"constant", "reason"}]}             #shared-weights)
"""

from __future__ import annotations

import re
from collections import Counter

from onnx2bir.compiler import Compilation


def _reason_kind(reason: str) -> str:
    """A reason with its names and numbers blanked, to group alike refusals."""
    text = re.sub(r"node '[^']*' \(([^)]*)\)", lambda m: f"node ({_rule_family(m[1])})", reason)
    text = re.sub(r"'[^']*'", "'…'", text)
    return re.sub(r"\d+", "N", text)


def _rule_family(rule: str) -> str:
    return rule if rule.startswith("generic.") else rule.split("_")[0]


def memory_json(compilation: Compilation) -> dict | None:
    if compilation.module is None:
        return None
    plan = compilation.memory_plan
    if plan is None:
        return {
            "planned": False,
            "resident": 0,
            "dram": None,
            "sbuf_high_water_bytes": None,
            "psum_high_water_bytes": None,
            "allocation_order": None,
            "dram_reasons": [],
            "tensors": [],
            "shared_weights": [],
            "shared_weights_refused": [],
        }
    decisions = sorted(plan.decisions.values(), key=lambda d: (d.first_item, d.tensor))
    kinds = Counter(_reason_kind(d.reason) for d in decisions if not d.resident)
    return {
        "planned": True,
        "resident": sum(d.resident for d in decisions),
        "dram": sum(not d.resident for d in decisions),
        "sbuf_high_water_bytes": plan.sbuf_high_water,
        "psum_high_water_bytes": plan.psum_high_water,
        "allocation_order": plan.allocation_order,
        "dram_reasons": [{"reason": k, "count": n} for k, n in kinds.most_common()],
        "tensors": [
            {
                "tensor": d.tensor,
                "resident": d.resident,
                "reason": d.reason,
                "bytes_per_partition": d.bytes_per_partition,
                "first_item": d.first_item,
                "last_item": d.last_item,
            }
            for d in decisions
        ],
        "shared_weights": [
            {
                "constant": home.key[0],
                "home": home.name,
                "readers": len(home.items),
                "bytes_per_partition": home.nbytes,
                "first_item": home.first,
                "last_item": home.last,
            }
            for home in plan.weight_homes
        ],
        "shared_weights_refused": [
            {"constant": key[0], "reason": reason} for key, reason in plan.weight_refusals.items()
        ],
    }


def memory_text(memory: dict | None, reasons: int = 5) -> list[str]:
    if not memory:
        return []
    if not memory["planned"]:
        return ["memory plan: off (every intermediate tensor in DRAM)"]
    lines = [
        f"memory plan: {memory['resident']} tensors in SBUF, {memory['dram']} in DRAM; "
        f"high-water per partition: SBUF {memory['sbuf_high_water_bytes']} B, "
        f"PSUM {memory['psum_high_water_bytes']} B"
    ]
    for entry in memory["dram_reasons"][:reasons]:
        lines.append(f"  in DRAM x{entry['count']}: {entry['reason']}")
    shared = memory.get("shared_weights", [])
    if shared or memory.get("shared_weights_refused"):
        loads = sum(home["readers"] - 1 for home in shared)
        lines.append(
            f"  weights shared in SBUF: {len(shared)} homes, {loads} loads saved; "
            f"{len(memory['shared_weights_refused'])} constants still loaded by some of "
            "their readers (no room)"
        )
    return lines
