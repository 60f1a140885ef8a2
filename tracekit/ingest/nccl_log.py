"""NCCL_DEBUG=INFO logs: communicators, ring orders, trees, transports and tuning choices.

What produces them: ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING
NCCL_DEBUG_FILE=<run>/nccl/%h.%p.log`` (one file per process), or a user's combined stdout. Every
line NCCL writes starts with ``host:pid:tid [cudaDev] NCCL INFO`` (WARN lines put ``file.cc:line``
before ``NCCL WARN``); launchers often add their own prefix in front (``[0] ``, ``[1,0]<stdout>:``,
``host: ``, ``(RayWorker pid=..)``, a timestamp), and two processes writing at once can leave two
prefixes on one line, so the *last* prefix on a line is the one that owns the message. The
``NCCL version 2.10.3+cuda11.0`` banner has no prefix in versions before 2.2x.

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
  [0xcf] ...``). Kept in ``placements`` (rank, host, pid, device, bus_id, gpu, group).

A line cut off mid-text (the file ends without its newline, another process's prefix starts
inside the message, or a message ends where its format cannot: a key without its value, a
``Trees`` item or an arrow half written) is parsed as far as it goes and named in a warning
with its file and line number.

Which rank runs on which node (``rank_layout``) comes from every source of placement at once:
INIT lines (host, localRank), nccl-tests headers (host), ``localRanks``/``nNodes``/``nranks``
(ranks the logs do not show); tracekit.ingest.nccl_placement derives it, and warns when the
logs cover only part of the job.

Lines that name a thread are attributed to the communicator that thread is initialising: the one
opened by an ``nRanks``/``Init START`` line, or, in the older format where the comm line comes
last, the next ``Init COMPLETE`` on that thread. Lines with no such comm keep ``comm_id`` null.

Files are streamed line by line (a 10k-rank job log is hundreds of MB; ``.gz`` is read too);
every line costs a few byte searches, and only lines holding a keyword of interest get the
prefix regex and one message regex, so the parse is linear in the input. Lines that are not
UTF-8 are skipped and counted; so are "lines" over 4 MiB (binary garbage).
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import polars as pl

from tracekit import runfolder
from tracekit.errors import TracekitError

# Only lines holding one of these can matter; the rest are skipped before any regex.
_KEYWORDS = re.compile(rb"Channel |Ring |Tree| Bytes -> Algo |comm 0x|NCCL version|NCCL WARN")
_HEADER = re.compile(
    r"#\s+Rank\s+(?P<rank>\d{1,9})(?:\s+Group\s+(?P<group>\d{1,9}))?\s+Pid\s+(?P<pid>\d{1,18})"
    r"\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d{1,9})\s+\[(?P<bus>0x[0-9a-fA-F]+)\]"
    r"(?:\s+(?P<gpu>\S.*?))?\s*$"
)
_HEADER_START = re.compile(r"#\s+Rank\s+\d")
# keys a comm line carries a value after: one of these (or the start of one) last is a cut line
_COMM_KEYS = ("nNodes", "localRanks", "localRank", "cudaDev", "nvmlDev", "busId", "commId")
_COMM_KEYS += ("MNNVL", "parent", "color", "key", "nranks", "nRanks", "rank")
_MAX_CUT_NAMED = 3  # cut lines named in the warning; the rest are counted
_MAX_LINE = 1 << 22  # a longer "line" is binary garbage: skipped, counted
_NOT_LOGS = (".json", ".json.gz", ".pkl", ".pickle", ".pt", ".parquet", ".npz")

# Prefix: [host:pid:tid ]"[dev] "[file.cc:line ]"NCCL INFO ", at line start or after a launcher tag.
# Numbers are bounded (ranks and channels to 9 digits, pids and bytes to 18) so that whatever a
# damaged line holds still fits an Int64 column; a line with a longer number does not match.
_PREFIX = re.compile(
    r"(?:^|(?<=[\s:>\]]))(?:(?P<host>[^\s:\[\]<>]+):(?P<pid>\d{1,18}):(?P<tid>\d+) )?"
    r"\[(?P<dev>\d+)\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE) "
)
_SRCLOC = re.compile(r"^[\w./-]+\.(?:cc|cu|cpp|c|h|hpp):\d+ ")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_COMM = re.compile(r"\bcomm (0x[0-9a-fA-F]+) rank (\d{1,9}) n[Rr]anks (\d{1,9})\b(.*)$")
_COMM_KV = re.compile(
    r"\b(nNodes|localRanks|localRank|cudaDev|nvmlDev|busId|commId) (0x[0-9a-fA-F]+|[0-9a-fA-F]+)\b"
)
_RING = re.compile(r"^Channel (\d{1,9})/(\d{1,9}) :((?: +\d{1,9})*) *$")
_RING_LINK = re.compile(r"^Ring (\d{1,9}) : (-?\d{1,9}) -> (\d{1,9}) -> (-?\d{1,9}) *$")
_TRANSPORT = re.compile(
    r"^(?:Channel|Ring) (\d{1,9})(?:/\d+)? : (\d{1,9})(?:\[[0-9a-fA-F]+\])? -> (\d{1,9})"
    r"(?:\[[0-9a-fA-F]+\])?(?: \[(send|receive)\])? via (.+?) *$"
)
_TREE_ITEM = re.compile(
    r"\[(\d{1,9})\] ?(-?\d{1,9}(?:/-?\d{1,9})*)->(-?\d{1,9})->(-?\d{1,9}(?:/-?\d{1,9})*)"
)
_TREE_ALT = re.compile(r"\|-?\d{1,9}(?:/-?\d{1,9})*->-?\d{1,9}->-?\d{1,9}(?:/-?\d{1,9})*")  # 2.5
_TREE_LINE = re.compile(
    r"^Tree (\d{1,9}) : (-?\d{1,9}) -> (-?\d{1,9}) -> ?(-?\d{1,9}(?:/-?\d{1,9})*) *$"
)
_TUNING = re.compile(
    r"^(?:(?P<op>[A-Za-z]+):\s+)?(?P<bytes>\d{1,18}) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: time (?P<time>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))?"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d{1,9})\.\.(?P<hi>\d{1,9})\})?"
    r"(?: comm (?P<comm>0x[0-9a-fA-F]+))?"
)

# NCCL's enums as printed by 2.19-2.21 tuning lines (include/nccl_common.h).
_ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTOS = ("LL", "LL128", "SIMPLE")
_OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AllToAll": "all_to_all",
    "Send": "send",
    "Recv": "recv",
}

S, I, F = pl.Utf8, pl.Int64, pl.Float64
COMMS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "rank": I,
    "nranks": I,
    "nnodes": I,
    "local_rank": I,
    "local_ranks": I,
    "cuda_dev": I,
    "nvml_dev": I,
    "bus_id": S,
    "unique_id": S,
    "file": S,
}
RINGS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "nchannels": I,
    "order": pl.List(I),
    "nranks": I,
    "complete": pl.Boolean,
}
RING_LINKS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "rank": I,
    "prev": I,
    "next": I,
    "nranks": I,
}
TREES_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "rank": I,
    "up": I,
    "down": pl.List(I),
    "nranks": I,
}
TUNING_SCHEMA = {
    "host": S,
    "pid": I,
    "comm_id": S,
    "op": S,
    "nccl_op": S,
    "bytes": I,
    "algo": S,
    "proto": S,
    "time_us": F,
    "channel_lo": I,
    "channel_hi": I,
}
PLACEMENTS_SCHEMA = {
    "rank": I,
    "host": S,
    "pid": I,
    "device": I,
    "bus_id": S,
    "gpu": S,
    "group": I,
    "file": S,
    "line": I,
}
TRANSPORTS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "src_rank": I,
    "dst_rank": I,
    "direction": S,
    "via": S,
    "transport": S,
    "nranks": I,
}


@dataclass(frozen=True)
class NcclLog:
    """Everything read from one or more NCCL_DEBUG logs (see the module docstring)."""

    files: tuple[str, ...]
    version: str | None
    comms: pl.DataFrame
    rings: pl.DataFrame
    trees: pl.DataFrame
    tuning: pl.DataFrame
    transports: pl.DataFrame
    warnings: tuple[str, ...]
    ring_links: pl.DataFrame
    placements: pl.DataFrame | None = None  # nccl-tests rank headers (PLACEMENTS_SCHEMA)


class _Table:
    """One output frame being built column by column, with each row's communicator key."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.names = columns
        self.lists: tuple[list, ...] = tuple([] for _ in columns)
        self.ckeys: list[tuple | None] = []

    def add(self, ckey: tuple | None, values: tuple) -> int:
        for column, value in zip(self.lists, values):
            column.append(value)
        self.ckeys.append(ckey)
        return len(self.ckeys) - 1

    def frame(self, comms: dict[tuple, dict[str, Any]], schema: dict[str, Any]) -> pl.DataFrame:
        cols: dict[str, list] = dict(zip(self.names, self.lists))
        rows = [comms.get(k) if k is not None else None for k in self.ckeys]
        cols["comm_id"] = [r["comm_id"] if r else None for r in rows]
        cols["nranks"] = [r["nranks"] if r else None for r in rows]
        empty = [None] * len(self.ckeys)
        return pl.DataFrame({name: cols.get(name, empty) for name in schema}, schema=schema)


class _Parser:
    """Per-call parse state: rows so far and, per thread, the communicator being initialised."""

    def __init__(self) -> None:
        self.comms: dict[tuple, dict[str, Any]] = {}
        self.rings = _Table(("host", "pid", "channel", "nchannels", "order"))
        self.links = _Table(("host", "pid", "channel", "rank", "prev", "next"))
        self.trees = _Table(("host", "pid", "channel", "rank", "up", "down"))
        self.transports = _Table(
            ("host", "pid", "channel", "src_rank", "dst_rank", "direction", "via", "transport")
        )
        self.tuning: list[dict[str, Any]] = []
        self.tree_seen: set[tuple] = set()
        self.open: dict[tuple, tuple] = {}  # thread -> comm key being initialised
        self.pending: dict[tuple, list] = {}  # thread -> (table, row) awaiting Init COMPLETE
        self.strings: dict[str, str] = {}  # one copy of each host name / transport text
        self.versions: list[str] = []
        self.nccl_warns: list[str] = []
        self.n_warn = 0
        self.bad_lines = 0
        self.long_lines = 0
        self.truncated_rings = 0
        self.placements: list[dict[str, Any]] = []
        self.cut: list[str] = []  # "file:line: text" of lines cut off mid-text
        self.n_cut = 0
        self.where = ("", 0)  # (file, line number) of the line being parsed
        self.line_len = 0  # its length in bytes, without the newline
        self.cut_at: tuple[str, int] | None = None  # the last line counted as cut

    def cut_line(self, why: str, text: str) -> None:
        """Count a line cut off mid-text; name the first few with their file and line."""
        if self.cut_at == self.where:  # one line is counted once, by its first reason
            return
        self.cut_at = self.where
        self.n_cut += 1
        if self.line_len >= 1023:  # NCCL's own limit: it truncates its lines at 1024 bytes
            why += " at NCCL's 1024-byte line limit"
        if len(self.cut) < _MAX_CUT_NAMED:
            tail = text.rstrip()[-60:]
            self.cut.append(f"{self.where[0]}:{self.where[1]}: {why} (...{tail!r})")

    def header(self, text: str) -> bool:
        """An nccl-tests ``# Rank N ... on HOST device D [0x..]`` line; True when it is one."""
        start = _HEADER_START.search(text)
        if start is None:
            return False
        m = _HEADER.match(text, start.start())
        if m is None:
            self.cut_line("nccl-tests rank header cut off", text)
            return True
        host = self.strings.setdefault(m.group("host"), m.group("host"))
        self.placements.append(
            {
                "rank": int(m.group("rank")),
                "host": host,
                "pid": int(m.group("pid")),
                "device": int(m.group("dev")),
                "bus_id": m.group("bus"),
                "gpu": m.group("gpu"),
                "group": _int_or_none(m.group("group")),
                "file": self.where[0],
                "line": self.where[1],
            }
        )
        return True

    # -- one line ---------------------------------------------------------------------------
    def line(self, text: str, file_idx: int, file_name: str) -> None:
        """Parse one decoded line."""
        if "NCCL version" in text:
            m = _VERSION.search(text)
            if m and m.group(1) not in self.versions:
                self.versions.append(m.group(1))
        m = _last_prefix(text)
        if m is None:
            return
        first = _PREFIX.search(text)
        if first is not None and first.start() < m.start():  # another writer cut this message
            self.cut_line("NCCL message cut off by another process's line", text[: m.start()])
        host, pid = m.group("host"), m.group("pid")
        if host is not None:
            host = self.strings.setdefault(host, host)
        thread = (file_idx, host, pid, m.group("tid") if host else m.group("dev"))
        msg = text[m.end() :].rstrip()
        if m.group("level") == "WARN":
            self.n_warn += 1
            if len(self.nccl_warns) < 3:
                self.nccl_warns.append(msg)
            return
        srcloc = _SRCLOC.match(msg)
        if srcloc:
            msg = msg[srcloc.end() :]
        self._dispatch(msg, host, int(pid) if pid is not None else None, thread, file_name)

    def _dispatch(
        self, msg: str, host: str | None, pid: int | None, thread: tuple, file_name: str
    ) -> None:
        if msg.startswith("Channel "):
            self._channel(msg, host, pid, thread)
        elif msg.startswith("Ring "):
            self._ring_line(msg, host, pid, thread)
        elif msg.startswith("Trees "):
            self._trees(msg, host, pid, thread)
        elif msg.startswith("Tree "):
            self._tree_line(msg, host, pid, thread)
        elif " Bytes -> Algo " in msg:
            self._tuning(msg, host, pid)
        elif "comm 0x" in msg:
            self._comm(msg, host, pid, thread, file_name)

    # -- communicators ----------------------------------------------------------------------
    def _comm(
        self, msg: str, host: str | None, pid: int | None, thread: tuple, file_name: str
    ) -> None:
        m = _COMM.search(msg)
        if m is None:
            return
        comm_id, rest = m.group(1), m.group(4)
        last = rest.split()[-1] if rest.split() else ""
        if last and any(k.startswith(last) for k in _COMM_KEYS):  # a key without its value
            self.cut_line("comm line cut off", msg)
        key = (host, pid, comm_id)
        row = self.comms.setdefault(
            key,
            {
                "comm_id": comm_id,
                "host": host,
                "pid": pid,
                "rank": int(m.group(2)),
                "nranks": int(m.group(3)),
                "file": file_name,
            },
        )
        for name, value in _COMM_KV.findall(rest):
            _set_comm_field(row, name, value)
        if "Destroy" in rest:
            return
        if "Init COMPLETE" in rest:
            for table, idx in self.pending.pop(thread, ()):
                table.ckeys[idx] = key
            if self.open.get(thread) == key:
                del self.open[thread]
        else:
            self.pending.pop(thread, None)
            self.open[thread] = key

    def _add(self, table: _Table, thread: tuple, values: tuple) -> None:
        key = self.open.get(thread)
        idx = table.add(key, values)
        if key is None:
            self.pending.setdefault(thread, []).append((table, idx))

    # -- rings, links, transports -----------------------------------------------------------
    def _channel(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = _RING.match(msg)
        if m is None:
            self._transport(msg, host, pid, thread)
            return
        order = [int(x) for x in m.group(3).split()]
        self._add(self.rings, thread, (host, pid, int(m.group(1)), int(m.group(2)), order))

    def _ring_line(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = _RING_LINK.match(msg)
        if m is None:
            self._transport(msg, host, pid, thread)
            return
        self._add(
            self.links,
            thread,
            (host, pid, int(m.group(1)), int(m.group(3)), int(m.group(2)), int(m.group(4))),
        )

    def _transport(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = _TRANSPORT.match(msg)
        if m is None:
            if re.match(r"^(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[[0-9a-fA-F]*\]?)? ?-", msg):
                self.cut_line("link line cut off", msg)  # "a -> b via ..." never finished
            return
        via = self.strings.setdefault(m.group(5), m.group(5))
        direction = m.group(4)
        self._add(
            self.transports,
            thread,
            (
                host,
                pid,
                int(m.group(1)),
                int(m.group(2)),
                int(m.group(3)),
                self.strings.setdefault(direction, direction) if direction else None,
                via,
                self.strings.setdefault(via.split("/", 1)[0], via.split("/", 1)[0]),
            ),
        )

    # -- trees ------------------------------------------------------------------------------
    def _trees(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        rest = _TREE_ALT.sub("", _TREE_ITEM.sub("", msg[len("Trees ") :]))
        if re.search(r"[\d\[\]>-]", rest):  # a half-written item after the whole ones
            self.cut_line("Trees line cut off", msg)
        for m in _TREE_ITEM.finditer(msg):
            left, me, right = m.group(2), int(m.group(3)), m.group(4)
            if "/" in right and "/" not in left:  # 2.4-2.6: up->me->down0/down1/down2
                up, down = int(left), _ranks(right)
            else:  # down0/down1/down2->me->up
                up, down = int(right), _ranks(left)
            self._tree_row(host, pid, thread, int(m.group(1)), me, up, down)

    def _tree_line(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = _TREE_LINE.match(msg)
        if m is not None:  # Tree c : up -> me -> downs
            self._tree_row(
                host,
                pid,
                thread,
                int(m.group(1)),
                int(m.group(3)),
                int(m.group(2)),
                _ranks(m.group(4)),
            )

    def _tree_row(
        self,
        host: str | None,
        pid: int | None,
        thread: tuple,
        channel: int,
        me: int,
        up: int,
        down: list[int],
    ) -> None:
        seen = (thread, self.open.get(thread), channel, me)
        if seen in self.tree_seen:
            return
        self.tree_seen.add(seen)
        self._add(self.trees, thread, (host, pid, channel, me, None if up < 0 else up, down))

    # -- tuning -----------------------------------------------------------------------------
    def _tuning(self, msg: str, host: str | None, pid: int | None) -> None:
        m = _TUNING.match(msg)
        if m is None or (m.group("time") is None and re.search(r" (?:time|tim|ti|t)$", msg)):
            self.cut_line("tuning line cut off", msg)
        if m is None:
            return
        op, time = m.group("op"), m.group("time")
        self.tuning.append(
            {
                "host": host,
                "pid": pid,
                "comm_id": m.group("comm"),
                "nccl_op": op,
                "op": _OPS.get(op, _snake(op)) if op else None,
                "bytes": int(m.group("bytes")),
                "algo": _enum_name(m.group("algo"), _ALGOS),
                "proto": _enum_name(m.group("proto"), _PROTOS),
                "time_us": float(time) if time else None,
                "channel_lo": _int_or_none(m.group("lo")),
                "channel_hi": _int_or_none(m.group("hi")),
            }
        )

    # -- results ----------------------------------------------------------------------------
    def result(self, files: list[str], warnings: list[str]) -> NcclLog:
        comms = pl.DataFrame(list(self.comms.values()), schema=COMMS_SCHEMA)
        rings = self.rings.frame(self.comms, RINGS_SCHEMA)
        if rings.height:
            rings = rings.with_columns(complete=_complete_expr())
            self.truncated_rings = int((~rings["complete"]).sum())
        return NcclLog(
            files=tuple(files),
            version=self.versions[0] if self.versions else None,
            comms=comms,
            rings=rings,
            trees=self.trees.frame(self.comms, TREES_SCHEMA),
            tuning=pl.DataFrame(self.tuning, schema=TUNING_SCHEMA),
            transports=self.transports.frame(self.comms, TRANSPORTS_SCHEMA),
            warnings=tuple(warnings + self._warnings(comms)),
            ring_links=self.links.frame(self.comms, RING_LINKS_SCHEMA),
            placements=pl.DataFrame(self.placements, schema=PLACEMENTS_SCHEMA),
        )

    def _warnings(self, comms: pl.DataFrame) -> list[str]:
        out = []
        if self.bad_lines:
            out.append(f"{self.bad_lines} lines were not UTF-8 text and were skipped")
        if self.long_lines:
            out.append(f"{self.long_lines} lines longer than {_MAX_LINE} bytes were skipped")
        if len(self.versions) > 1:
            out.append(f"several NCCL versions in one run: {', '.join(self.versions)}")
        if self.truncated_rings:
            out.append(
                f"{self.truncated_rings} 'Channel xx/yy : ...' ring lines are incomplete "
                "(NCCL cuts long lines): their order is not used"
            )
        if comms.height == 0:
            out.append(
                "no communicator lines ('comm 0x.. rank .. nranks ..'): rank layout "
                + ("from nccl-tests rank headers only" if self.placements else "unknown")
                + "; log with NCCL_DEBUG_SUBSYS including INIT"
            )
        if self.n_cut:
            more = f" (and {self.n_cut - len(self.cut)} more)" if self.n_cut > len(self.cut) else ""
            out.append(
                f"{self.n_cut} line{'s' if self.n_cut > 1 else ''} cut off mid-text, parsed as "
                "far as they go: " + "; ".join(self.cut) + more
            )
        if self.n_warn:
            out.append(f"{self.n_warn} NCCL WARN lines, first: {self.nccl_warns[0]}")
        return out


# -- helpers ------------------------------------------------------------------------------------
def _last_prefix(text: str) -> re.Match[str] | None:
    """The last ``host:pid:tid [dev] NCCL LEVEL`` prefix on the line (it owns the message).

    Usually the first match is at position 0 and the line holds no other " NCCL ", so this is
    one anchored match plus one substring search."""
    m = _PREFIX.search(text)
    while m is not None and text.find(" NCCL ", m.end()) >= 0:
        nxt = _PREFIX.search(text, m.end())
        if nxt is None:
            break
        m = nxt
    return m


def _set_comm_field(row: dict[str, Any], name: str, value: str) -> None:
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


def _ranks(text: str) -> list[int]:
    return [int(x) for x in text.split("/") if int(x) >= 0]


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _enum_name(text: str, names: tuple[str, ...]) -> str:
    if text.isdigit():
        return names[int(text)] if len(text) < 3 and int(text) < len(names) else text
    return text.upper()


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _complete_expr() -> pl.Expr:
    """A ring line is complete when it lists every rank 0..n-1 once (n = nranks when known)."""
    order = pl.col("order")
    n = pl.coalesce(pl.col("nranks"), order.list.len())
    return (
        (order.list.len() == n)
        & (order.list.n_unique() == n)
        & (order.list.max() == n - 1)
        & (order.list.min() == 0)
    ).fill_null(False)


# -- files --------------------------------------------------------------------------------------
def _open(path: Path) -> IO[bytes]:
    try:
        if path.name.endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as exc:
        raise TracekitError(f"cannot read NCCL log ({exc.strerror or exc})", path) from None


def _raw_lines(f: IO[bytes], parser: _Parser) -> Iterator[bytes]:
    """Lines as bytes; an over-long run without a newline is skipped and counted."""
    while True:
        chunk = f.readline(_MAX_LINE)
        if not chunk:
            return
        if len(chunk) == _MAX_LINE and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):
                chunk = f.readline(_MAX_LINE)
            parser.long_lines += 1
            continue
        yield chunk


def _parse_file(path: Path, idx: int, parser: _Parser) -> int:
    """Feed one file to the parser; returns how many NCCL lines it had."""
    found = 0
    name = str(path)
    with _open(path) as f:
        try:
            for lineno, raw in enumerate(_raw_lines(f, parser), 1):
                if not raw.isascii():
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        parser.bad_lines += 1
                        continue
                if b"NCCL" not in raw:
                    if b"Rank" in raw and b"#" in raw:  # nccl-tests' rank headers
                        parser.where = (name, lineno)
                        found += parser.header(raw.decode("utf-8"))
                    continue
                found += b"NCCL INFO" in raw or b"NCCL WARN" in raw or b"NCCL version" in raw
                if _KEYWORDS.search(raw):
                    parser.where = (name, lineno)
                    parser.line_len = len(raw.rstrip(b"\r\n"))
                    text = raw.decode("utf-8")
                    if not raw.endswith(b"\n") and b"NCCL INFO" in raw:
                        parser.cut_line("the file ends inside this line", text)
                    parser.line(text, idx, name)
        except (OSError, EOFError, zlib.error) as exc:
            raise TracekitError(f"cannot read NCCL log ({exc})", path) from None
    return found


def _log_files(paths_or_dir: Path | Sequence[Path]) -> tuple[list[Path], Path | None]:
    """The log files named: a file, a folder (run folders: their nccl/), or a list of either."""
    items = (
        [Path(paths_or_dir)]
        if isinstance(paths_or_dir, (str, Path))
        else [Path(p) for p in paths_or_dir]
    )
    files: list[Path] = []
    folder = items[0] if len(items) == 1 and items[0].is_dir() else None
    for item in items:
        if not item.exists():
            raise TracekitError("no such file or folder", item)
        if item.is_file():
            files.append(item)
            continue
        root = runfolder.nccl_dir(item) if runfolder.is_run_folder(item) else item
        files.extend(p for p in sorted(root.rglob("*")) if _is_log_file(p))
    if not files:
        raise TracekitError("no NCCL log files here", folder or items[0] if items else ".")
    return files, folder


def _is_log_file(path: Path) -> bool:
    name = path.name
    return path.is_file() and not name.startswith(".") and not name.endswith(_NOT_LOGS)


# -- public API ---------------------------------------------------------------------------------
def read_nccl_logs(paths_or_dir: Path | Sequence[Path]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO logs: one file, several, a folder, or a run folder (its nccl/)."""
    files, folder = _log_files(paths_or_dir)
    parser = _Parser()
    warnings: list[str] = []
    total = 0
    for idx, path in enumerate(files):
        found = _parse_file(path, idx, parser)
        total += found
        if not found and len(files) > 1:
            warnings.append(f"{path.name}: no NCCL lines")
    if total == 0:
        what = f" ({parser.bad_lines} lines were not text)" if parser.bad_lines else ""
        raise TracekitError(
            f"no NCCL log lines ('host:pid:tid [dev] NCCL INFO ...') found{what}",
            files[0] if len(files) == 1 else folder or files[0],
        )
    from tracekit.ingest.nccl_placement import derive

    log = parser.result([str(p) for p in files], warnings)
    layout_warnings = derive(log, _world(log))[1]
    return dataclasses.replace(log, warnings=log.warnings + tuple(layout_warnings))


def _world(log: NcclLog, nranks: int | None = None) -> pl.DataFrame:
    """Rows of the world communicator: the one with the most ranks (or exactly NRANKS)."""
    comms = log.comms
    if comms.height == 0:
        return comms
    n = nranks if nranks is not None else int(comms["nranks"].max())
    world = comms.filter(pl.col("nranks") == n)
    ids = world["unique_id"].drop_nulls()
    if ids.len():
        top = ids.value_counts(sort=True)["unique_id"][0]
        world = world.filter(pl.col("unique_id").is_null() | (pl.col("unique_id") == top))
    return world.sort("rank").unique("rank", keep="first", maintain_order=True)


def rank_layout(log: NcclLog) -> dict[int, dict]:
    """rank -> {host, node, local_rank, source} for the world communicator (the one with most
    ranks), from every source of placement: INIT lines, nccl-tests rank headers, localRanks
    (tracekit.ingest.nccl_placement; source "init", "nccl-tests" or "localRanks"). The one
    derivation of the layout: tracekit.topology.nccl_layout calls it."""
    from tracekit.ingest.nccl_placement import derive

    return derive(log, _world(log))[0]


def ring_order(log: NcclLog, nranks: int | None = None) -> list[int] | None:
    """Ring 0's rank order for the largest communicator (or the one with NRANKS ranks).

    Sources, best first: a complete ``Channel 00/..`` line of that communicator; the ``Ring 00 :
    prev -> me -> next`` links of all its ranks; a complete unattributed ``Channel 00`` line of
    that size. None when no complete ring 0 is in the log (e.g. NCCL cut the line short).
    """
    world = _world(log, nranks)
    n = nranks if nranks is not None else (int(world["nranks"][0]) if world.height else None)
    rings = log.rings.filter((pl.col("channel") == 0) & pl.col("complete"))
    if n is not None:
        mine = rings.filter(pl.col("nranks") == n)
        if mine.height:
            return list(mine["order"][0])
        linked = _ring_from_links(log.ring_links, n)
        if linked is not None:
            return linked
        rings = rings.filter(pl.col("order").list.len() == n)
    if rings.height == 0:
        return None
    best = rings.with_columns(_len=pl.col("order").list.len()).sort("_len", descending=True)
    return list(best["order"][0])


def _ring_from_links(links: pl.DataFrame, n: int) -> list[int] | None:
    """Follow rank -> next around channel 0 when every rank 0..n-1 logged its link."""
    ch0 = links.filter(
        (pl.col("channel") == 0) & (pl.col("nranks").is_null() | (pl.col("nranks") == n))
    )
    nxt = {r: x for r, x in zip(ch0["rank"].to_list(), ch0["next"].to_list())}
    if len(nxt) != n or set(nxt) != set(range(n)):  # n is the log's word: sized by data only
        return None
    order, cur = [0], nxt[0]
    while cur != 0 and len(order) <= n:
        order.append(cur)
        cur = nxt.get(cur, -1)
    return order if cur == 0 and len(order) == n and sorted(order) == list(range(n)) else None
