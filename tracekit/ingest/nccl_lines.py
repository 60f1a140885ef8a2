"""The NCCL_DEBUG=INFO line grammar: which lines matter, whose prefix owns them, what each says.

Every line NCCL writes starts with ``host:pid:tid [cudaDev] NCCL INFO`` (WARN lines put
``file.cc:line`` before ``NCCL WARN``); launchers often add their own prefix in front (``[0] ``,
``[1,0]<stdout>:``, ``host: ``, ``(RayWorker pid=..)``, a timestamp), and two processes writing
at once can leave two prefixes on one line, so the *last* prefix on a line is the one that owns
the message (:func:`last_prefix`). The ``NCCL version 2.10.3+cuda11.0`` banner has no prefix in
versions before 2.2x.

Lines read (everything else is ignored), as seen in NCCL 2.4 to 2.28 logs pasted in public
NVIDIA/nccl and pytorch/pytorch issues:

* communicator, merged per (host, pid, comm pointer) from any of
  ``comm 0x7f784f101d90 rank 1 nranks 4 cudaDev 1 busId 7000 - Init COMPLETE``          (2.7-2.18)
  ``comm 0x8ec0ac0 rank 6 nRanks 16 nNodes 2 localRanks 8 localRank 6 MNNVL 0``         (2.19+)
  ``ncclCommInitRank comm 0x55a0be47d620 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000
  commId 0x221dee7fa4558566 - Init COMPLETE``   (2.2x; commId is the same on every rank of
  the communicator, the comm pointer differs per process)
* ring order, printed by the communicator's rank 0:
  ``Channel 00/08 :    0   5   4   7   6   3   2   1   8  13  12  15  14  11  10   9``.
  NCCL cuts these lines at a fixed length: on large jobs a "ring" lists only the first ~20 ranks
  (NVIDIA/nccl#514). Such rings are kept with ``complete=False`` and never used as an order.
* ring links, one per rank and channel (2.19+): ``Ring 00 : 3 -> 0 -> 1`` (prev -> me -> next).
  With every rank's file present they rebuild a ring that the Channel line cut short.
* trees: ``Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2`` (down0/down1/down2->me->up); the 2.4-2.6
  form ``Trees [0] 22->23->-1/-1/-1`` (up->me->downs) and ``Tree 1 : 2 -> 0 -> 1/-1/-1`` (2.19+).
* transports: ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``,
  ``Channel 03/0 : 5[5] -> 12[4] [send] via NET/IB/3``, ``Channel 07 : 2[6] -> 3[7] via SHM/direct/
  direct``, and before 2.7 ``Ring 00 : 12[41000] -> 11[2d000] via P2P/IPC``.
* tuning (rank 0 only): ``65536 Bytes -> Algo 0 proto 0 time 37.798233`` (2.19-2.21: numbers, no
  op name, time in us) and ``AllReduce: 4 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..0}``
  (2.22+: names, no time).
* nccl-tests' rank headers, which place every rank of the job on its host (rank 0's output
  lists them all): ``#  Rank  0 Group  0 Pid  1234 on  host1 device  0 [0x1b] NVIDIA H100``
  (``Group`` since nccl-tests 2.1x; older ones print ``#   Rank 15 Pid  65671 on nodeb device  7
  [0xcf] ...``).
"""

from __future__ import annotations

import re
from typing import Any

# Only lines holding one of these can matter; the rest are skipped before any regex.
KEYWORDS = re.compile(rb"Channel |Ring |Tree| Bytes -> Algo |comm 0x|NCCL version|NCCL WARN")
HEADER = re.compile(
    r"#\s+Rank\s+(?P<rank>\d{1,9})(?:\s+Group\s+(?P<group>\d{1,9}))?\s+Pid\s+(?P<pid>\d{1,18})"
    r"\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d{1,9})\s+\[(?P<bus>0x[0-9a-fA-F]+)\]"
    r"(?:\s+(?P<gpu>\S.*?))?\s*$"
)
HEADER_START = re.compile(r"#\s+Rank\s+\d")
# keys a comm line carries a value after: one of these (or the start of one) last is a cut line
COMM_KEYS: tuple[str, ...] = (
    "nNodes",
    "localRanks",
    "localRank",
    "cudaDev",
    "nvmlDev",
    "busId",
    "commId",
)
COMM_KEYS += ("MNNVL", "parent", "color", "key", "nranks", "nRanks", "rank")

# Prefix: [host:pid:tid ]"[dev] "[file.cc:line ]"NCCL INFO ", at line start or after a launcher tag.
# Numbers are bounded (ranks and channels to 9 digits, pids and bytes to 18) so that whatever a
# damaged line holds still fits an Int64 column; a line with a longer number does not match.
PREFIX = re.compile(
    r"(?:^|(?<=[\s:>\]]))(?:(?P<host>[^\s:\[\]<>]+):(?P<pid>\d{1,18}):(?P<tid>\d+) )?"
    r"\[(?P<dev>\d+)\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE) "
)
SRCLOC = re.compile(r"^[\w./-]+\.(?:cc|cu|cpp|c|h|hpp):\d+ ")
VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
COMM = re.compile(r"\bcomm (0x[0-9a-fA-F]+) rank (\d{1,9}) n[Rr]anks (\d{1,9})\b(.*)$")
COMM_KV = re.compile(
    r"\b(nNodes|localRanks|localRank|cudaDev|nvmlDev|busId|commId) (0x[0-9a-fA-F]+|[0-9a-fA-F]+)\b"
)
RING = re.compile(r"^Channel (\d{1,9})/(\d{1,9}) :((?: +\d{1,9})*) *$")
RING_LINK = re.compile(r"^Ring (\d{1,9}) : (-?\d{1,9}) -> (\d{1,9}) -> (-?\d{1,9}) *$")
TRANSPORT = re.compile(
    r"^(?:Channel|Ring) (\d{1,9})(?:/\d+)? : (\d{1,9})(?:\[[0-9a-fA-F]+\])? -> (\d{1,9})"
    r"(?:\[[0-9a-fA-F]+\])?(?: \[(send|receive)\])? via (.+?) *$"
)
TREE_ITEM = re.compile(
    r"\[(\d{1,9})\] ?(-?\d{1,9}(?:/-?\d{1,9})*)->(-?\d{1,9})->(-?\d{1,9}(?:/-?\d{1,9})*)"
)
TREE_ALT = re.compile(r"\|-?\d{1,9}(?:/-?\d{1,9})*->-?\d{1,9}->-?\d{1,9}(?:/-?\d{1,9})*")  # 2.5
TREE_LINE = re.compile(
    r"^Tree (\d{1,9}) : (-?\d{1,9}) -> (-?\d{1,9}) -> ?(-?\d{1,9}(?:/-?\d{1,9})*) *$"
)
TUNING = re.compile(
    r"^(?:(?P<op>[A-Za-z]+):\s+)?(?P<bytes>\d{1,18}) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: time (?P<time>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))?"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d{1,9})\.\.(?P<hi>\d{1,9})\})?"
    r"(?: comm (?P<comm>0x[0-9a-fA-F]+))?"
)

# NCCL's enums as printed by 2.19-2.21 tuning lines (include/nccl_common.h).
ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AllToAll": "all_to_all",
    "Send": "send",
    "Recv": "recv",
}


def last_prefix(text: str) -> re.Match[str] | None:
    """The last ``host:pid:tid [dev] NCCL LEVEL`` prefix on the line (it owns the message).

    Usually the first match is at position 0 and the line holds no other " NCCL ", so this is
    one anchored match plus one substring search."""
    m = PREFIX.search(text)
    while m is not None and text.find(" NCCL ", m.end()) >= 0:
        nxt = PREFIX.search(text, m.end())
        if nxt is None:
            break
        m = nxt
    return m


def set_comm_field(row: dict[str, Any], name: str, value: str) -> None:
    """Store a comm line's ``key value`` pair (COMM_KV) under its column name; a number too
    long for a column is left out."""
    column = {
        "nNodes": "nnodes",
        "localRanks": "local_ranks",
        "localRank": "local_rank",
        "cudaDev": "cuda_dev",
        "nvmlDev": "nvml_dev",
        "busId": "bus_id",
        "commId": "unique_id",
    }[name]
    if column in ("bus_id", "unique_id"):
        row[column] = value
    elif value.isdigit() and len(value) <= 9:
        row[column] = int(value)


def ranks(text: str) -> list[int]:
    """``1/-1/2`` -> [1, 2]: the ranks of a tree's down list (-1: none)."""
    return [int(x) for x in text.split("/") if int(x) >= 0]


def int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None else None


def enum_name(text: str, names: tuple[str, ...]) -> str:
    """An algorithm or protocol name: NCCL's enum number looked up in NAMES, else upper-cased."""
    if text.isdigit():
        return names[int(text)] if len(text) < 3 and int(text) < len(names) else text
    return text.upper()


def snake(name: str) -> str:
    """``AllToAll`` -> ``all_to_all``: an NCCL op name that OPS does not list."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
