"""The cast plan of a BIR program: where it rounds a value of the model to a narrower dtype.

A compile derives it (`onnx2bir/codegen/cast_plan.py`) and records it in the module's metadata
(`to_json`), so that a saved program can be judged against its model later; the emulating
oracle (`runtime/oracle/emulating.py`) inserts the same roundings, and the verdict reads the
probed tensors from the machine (docs/validation.md#the-emulating-oracle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class CastPoint:
    """ONNX node `node` reads tensor `input` rounded to `dtype`."""

    node: str
    input: str
    dtype: str
    # "operand" (a PE operand), "storage" (the tensor is stored in `dtype`), or "recurrent"
    # (`input` is a recurrent op's R: its recurrent products take R and the step's state
    # h_{t-1} rounded; the oracle computes the op step by step to round the state)
    kind: str
    exact: bool = True  # the oracle rounds at the same point
    reason: str | None = None  # why not exact

    def to_json(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True, slots=True)
class Probe:
    """Where the machine holds tensor `tensor` once its producer is done: location
    `location`, flat (a DRAM tensor) or, with `inner`, an SBUF home whose rows of `inner`
    elements are dealt over the partitions (docs/memory_planner.md#layout), with `group` in
    groups of that many rows (docs/memory_planner.md#groups). It is read at the
    first instruction that reads the location and does not belong to node `producer`.

    With `whole`, the probe reads `images` images of model tensor `whole` from image `part`
    on (shape [images, ...]), which the program computes a group of images at a time
    (patterns/batch_split.py); the reader puts the pieces of `whole` back together along the
    batch."""

    tensor: str
    location: str
    producer: str
    inner: int | None = None
    group: int | None = None  # rows per group of a home in groups
    whole: str | None = None
    part: int | None = None
    images: int | None = None

    def to_json(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True, slots=True)
class Boundary:
    """The output `tensor` of a raised kernel inside which node `node` reads `operand` (input
    `position`) rounded, a value the program never stores: the machine's rounding of it can
    differ from onnxruntime's where onnxruntime's value sits near a half-way point. The
    verdict reads `tensor` from the machine, checks it with an allowance for exactly those
    roundings, and feeds the machine's value on (docs/validation.md#kernel-boundaries)."""

    tensor: str
    node: str
    operand: str
    position: int
    dtype: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class OnlineSoftmax:
    """A raised attention kernel the oracle computes as the kernel does, key tile by key tile
    (runtime/oracle/online_softmax.py): the block's Softmax `node` (or, for a fused
    `Attention` node, that node, computed through its ONNX function body), its output
    `tensor`, the kernel's `key_tile`, the `dtype` it stores probabilities and its output in,
    the head dim and the key count (docs/validation.md#online-softmax)."""

    tensor: str
    node: str
    key_tile: int
    dtype: str
    head_dim: int
    seq_k: int
    # q, kᵀ or v as the block reads them, rounded where the program never stores them (a
    # view the kernel reads through strides): the oracle allows for flips of their rounding
    flips: tuple[str, ...] = ()

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["flips"] = list(self.flips)
        return doc


@dataclass(frozen=True, slots=True)
class ExpandedAttention:
    """A fused `Attention` node `node` the compile decomposed into matmul → softmax → matmul
    (patterns/attention/decompose.py), both products on `dtype` operands: the oracle computes
    it through the ONNX function body, q, k and v rounded as the node's inputs and the
    probabilities rounded where the PV product reads them; `tensor` is its output, `seq_k`
    the PV product's length (docs/validation.md#expanded-attention)."""

    tensor: str
    node: str
    dtype: str
    seq_k: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CastPlan:
    points: tuple[CastPoint, ...] = ()
    unemulated: dict[str, str] = field(default_factory=dict)  # node → why
    probes: dict[str, Probe] = field(default_factory=dict)  # tensor → where the machine holds it
    boundaries: dict[str, Boundary] = field(default_factory=dict)  # tensor → its boundary
    online: dict[str, OnlineSoftmax] = field(default_factory=dict)  # block output → kernel
    expanded: dict[str, ExpandedAttention] = field(default_factory=dict)  # output → node

    def to_json(self) -> dict:
        return {
            "casts": [point.to_json() for point in self.points],
            "unemulated": [{"node": n, "reason": r} for n, r in self.unemulated.items()],
            "probes": [probe.to_json() for probe in self.probes.values()],
            "boundaries": [boundary.to_json() for boundary in self.boundaries.values()],
            "online_softmax": [entry.to_json() for entry in self.online.values()],
            "expanded_attention": [entry.to_json() for entry in self.expanded.values()],
        }

    @classmethod
    def from_json(cls, doc: dict) -> CastPlan:
        """The plan a BIR file's metadata carries (`to_json`)."""
        return cls(
            tuple(CastPoint(**point) for point in doc.get("casts", [])),
            {entry["node"]: entry["reason"] for entry in doc.get("unemulated", [])},
            {entry["tensor"]: Probe(**entry) for entry in doc.get("probes", [])},
            {entry["tensor"]: Boundary(**entry) for entry in doc.get("boundaries", [])},
            {
                e["tensor"]: OnlineSoftmax(**{**e, "flips": tuple(e.get("flips", ()))})
                for e in doc.get("online_softmax", [])
            },
            {e["tensor"]: ExpandedAttention(**e) for e in doc.get("expanded_attention", [])},
        )

    @property
    def rounded_tensors(self) -> set[str]:
        return {point.input for point in self.points}
