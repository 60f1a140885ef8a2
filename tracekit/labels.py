"""The one naming scheme for ``record_function`` labels: strategies write it, the analysis reads it.

Every label is a colon-separated string. Builders below produce them; :func:`parse` reads any
label back into a :class:`Label` (or None for names that are not ours, e.g. ``aten::mm``).

Phases (one per step, nested inside torch's own ``ProfilerStep#<n>``)::

    step                          the whole training step
    forward                       the forward pass (loss included)
    backward                      the backward pass (overlapped communication launches inside it)
    optimizer                     optimizer.step()
    zero_grad                     clearing gradients / bucket buffers

Communication (the label wraps the *call* on the compute thread; on gloo the transfer itself is a
``gloo:<op>`` span on a ``pt_gloo_runloop`` thread, on NCCL a kernel)::

    comm:<op>:<what>[:<qualifier>...]
        op        all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all
                  | send | recv | barrier           (the op names, docs/labels.md), or
                  wait                              waiting for an asynchronous collective
        what      <kind><index> naming what is moved: bucket3 (DDP bucket), unit2 (ZeRO-3/FSDP
                  unit), layer1 (TP layer), shard0, ... or a plain word (params, grads)
        qualifier fwd | bwd (which pass an all-gather serves), or any further word

    comm:all_reduce:bucket3       DP: launch of bucket 3's gradient all-reduce
    comm:wait:bucket3             DP: waiting for it before the optimizer
    comm:all_gather:unit2:fwd     ZeRO-3/FSDP: gather unit 2's parameters for the forward
    comm:all_gather:unit2:bwd     ... and again for the backward
    comm:reduce_scatter:unit2     ZeRO-2/3/FSDP: reduce-scatter of unit 2's gradients
    comm:all_reduce:layer1:attn:fwd   TP (Megatron g): sum of layer 1's attention partial outputs
    comm:all_reduce:layer1:mlp:bwd    TP (Megatron f): sum of the gradient into layer 1's MLP

Pipeline compute (per stage and microbatch; PipeDream adds the weight version used)::

    F:s<stage>:mb<m>[:v<version>]     forward of microbatch m on stage s
    B:s<stage>:mb<m>[:v<version>]     backward (for inputs, or the whole backward)
    W:s<stage>:mb<m>[:v<version>]     backward for weights (zero-bubble style split)
    B:s<stage>:mb<m>:v<u>:st<k>       PipeDream: the backward used stashed version u, and the
                                      weight update it feeds lands k versions later (staleness)

Pipeline point-to-point (the call on the compute thread; ``peer`` is the other rank)::

    comm:send:act:mb<m>:peer<r>       send microbatch m's activations downstream to rank r
    comm:recv:act:mb<m>:peer<r>       receive them from upstream rank r (blocking: the wait is inside)
    comm:send:grad:mb<m>:peer<r>      send the gradient w.r.t. the stage's input upstream
    comm:recv:grad:mb<m>:peer<r>      receive the gradient of the stage's output from downstream
    parse() fills ``microbatch`` and ``peer`` of a comm label from ``mb<m>`` / ``peer<r>`` qualifiers.

Stages, microbatches, indices and versions are 0-based integers, written without padding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

STEP = "step"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
ZERO_GRAD = "zero_grad"
PHASES = (STEP, FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD)

COMM_PREFIX = "comm"
WAIT = "wait"
#: The communication ops, one word each, written once: the ``<op>`` of ``comm:<op>:...`` labels
#: and the words of the events' ``op`` column, to which ingest maps every source's own names
#: (tracekit.ingest.collectives, flight_recorder, nccl_lines; tests/test_ingest.py checks it).
COMM_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send",
    "recv",
    "barrier",
)
PIPELINE_KINDS = ("F", "B", "W")
FWD, BWD = "fwd", "bwd"

_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_INDEXED = re.compile(r"^(?P<kind>[A-Za-z_]+?)(?P<index>\d+)$")
_COMM = re.compile(
    r"^comm:(?P<op>[a-z_]+):(?P<what>[A-Za-z0-9_\-]+)(?P<rest>(?::[A-Za-z0-9_\-]+)*)$"
)
_PIPE = re.compile(
    r"^(?P<kind>[FBW]):s(?P<stage>\d+):mb(?P<mb>\d+)(?::v(?P<version>\d+))?(?::st(?P<staleness>\d+))?$"
)
_QUAL_MB = re.compile(r"^mb(\d+)$")
_QUAL_PEER = re.compile(r"^peer(\d+)$")


@dataclass(frozen=True)
class Label:
    """A parsed label. ``family`` is "phase", "comm" or "pipeline"; unused fields are None."""

    family: str
    name: str
    phase: str | None = None  # family "phase": step | forward | backward | ...
    op: str | None = None  # family "comm": all_reduce | ... | wait
    what: str | None = None  # family "comm": bucket3, unit2, params
    what_kind: str | None = None  # bucket, unit, layer ... (None for a plain word)
    index: int | None = None  # the number in ``what``
    qualifiers: tuple[str, ...] = ()  # fwd | bwd | ...
    kind: str | None = None  # family "pipeline": F | B | W
    stage: int | None = None
    microbatch: int | None = None
    version: int | None = None
    peer: int | None = None  # family "comm": the other rank of a p2p label (peer<r>)
    staleness: int | None = None  # family "pipeline": PipeDream update staleness (st<k>)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _check_word(word: str) -> str:
    if not _WORD.match(word) or ":" in word:
        raise ValueError(
            f"label part {word!r} must be a word ([A-Za-z0-9_-], not starting with a digit)"
        )
    return word


# --- builders -----------------------------------------------------------------------------------


def bucket(i: int) -> str:
    """``bucket<i>``: a DDP-style gradient bucket."""
    return f"bucket{int(i)}"


def unit(i: int) -> str:
    """``unit<i>``: a ZeRO-3 / FSDP sharding unit (usually one transformer block)."""
    return f"unit{int(i)}"


def layer(i: int) -> str:
    """``layer<i>``: a transformer layer (tensor parallel collectives)."""
    return f"layer{int(i)}"


def comm(op: str, what: str, *qualifiers: str) -> str:
    """``comm:<op>:<what>[:<qualifier>...]``, e.g. ``comm("all_reduce", bucket(3))``."""
    if op not in COMM_OPS and op != WAIT:
        raise ValueError(f"unknown communication op {op!r}; expected one of {COMM_OPS + (WAIT,)}")
    parts = [COMM_PREFIX, op, _check_word(what), *(_check_word(q) for q in qualifiers)]
    return ":".join(parts)


def wait(what: str, *qualifiers: str) -> str:
    """``comm:wait:<what>``: blocking on an asynchronous collective launched earlier."""
    return comm(WAIT, what, *qualifiers)


def all_reduce_bucket(i: int) -> str:
    return comm("all_reduce", bucket(i))


def wait_bucket(i: int) -> str:
    return wait(bucket(i))


def all_gather_unit(i: int, direction: str) -> str:
    """``comm:all_gather:unit<i>:fwd|bwd``."""
    if direction not in (FWD, BWD):
        raise ValueError(f"direction must be {FWD!r} or {BWD!r}, not {direction!r}")
    return comm("all_gather", unit(i), direction)


def reduce_scatter_unit(i: int) -> str:
    """``comm:reduce_scatter:unit<i>``."""
    return comm("reduce_scatter", unit(i))


TP_PARTS = ("attn", "mlp")


def tp_all_reduce(i: int, part: str, direction: str) -> str:
    """``comm:all_reduce:layer<i>:attn|mlp:fwd|bwd``: a Megatron tensor-parallel all-reduce
    (``g`` in the forward, ``f`` in the backward). parse() gives what_kind "layer", index i,
    qualifiers (part, direction)."""
    if part not in TP_PARTS:
        raise ValueError(f"part must be one of {TP_PARTS}, not {part!r}")
    if direction not in (FWD, BWD):
        raise ValueError(f"direction must be {FWD!r} or {BWD!r}, not {direction!r}")
    return comm("all_reduce", layer(i), part, direction)


def pipeline(
    kind: str, stage: int, microbatch: int, version: int | None = None, staleness: int | None = None
) -> str:
    """``F|B|W:s<stage>:mb<m>[:v<version>[:st<staleness>]]``."""
    if kind not in PIPELINE_KINDS:
        raise ValueError(f"pipeline kind must be one of {PIPELINE_KINDS}, not {kind!r}")
    if staleness is not None and version is None:
        raise ValueError("a staleness needs the version it refers to")
    name = f"{kind}:s{int(stage)}:mb{int(microbatch)}"
    if version is not None:
        name += f":v{int(version)}"
    return name if staleness is None else f"{name}:st{int(staleness)}"


P2P_WHATS = ("act", "grad")


def p2p(op: str, what: str, microbatch: int, peer: int) -> str:
    """``comm:send|recv:act|grad:mb<m>:peer<r>``: pipeline point-to-point of one microbatch."""
    if op not in ("send", "recv"):
        raise ValueError(f"p2p op must be 'send' or 'recv', not {op!r}")
    if what not in P2P_WHATS:
        raise ValueError(f"p2p payload must be one of {P2P_WHATS}, not {what!r}")
    return comm(op, what, f"mb{int(microbatch)}", f"peer{int(peer)}")


# --- reader -------------------------------------------------------------------------------------


def parse(name: str) -> Label | None:
    """Read a label back; None when ``name`` does not follow this scheme."""
    if name in PHASES:
        return Label("phase", name, phase=name)
    m = _COMM.match(name)
    if m:
        op = m["op"]
        if op not in COMM_OPS and op != WAIT:
            return None
        what = m["what"]
        im = _INDEXED.match(what)
        rest = tuple(q for q in m["rest"].split(":") if q)
        mb = next((int(x[1]) for x in map(_QUAL_MB.match, rest) if x), None)
        peer = next((int(x[1]) for x in map(_QUAL_PEER.match, rest) if x), None)
        return Label(
            "comm",
            name,
            op=op,
            what=what,
            what_kind=im["kind"] if im else None,
            index=int(im["index"]) if im else None,
            qualifiers=rest,
            microbatch=mb,
            peer=peer,
        )
    m = _PIPE.match(name)
    if m:
        return Label(
            "pipeline",
            name,
            kind=m["kind"],
            stage=int(m["stage"]),
            microbatch=int(m["mb"]),
            version=None if m["version"] is None else int(m["version"]),
            staleness=None if m["staleness"] is None else int(m["staleness"]),
        )
    return None


def is_comm(name: str) -> bool:
    """True for a ``comm:*`` label (waits included)."""
    lab = parse(name)
    return lab is not None and lab.family == "comm"
