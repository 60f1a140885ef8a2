"""NCCL log lines to rows: communicators (INIT), rings, ring links, trees, transports, tuning
and nccl-tests placements, one :class:`Parser` per read (tracekit.ingest.nccl_lines says what
each line looks like).

Lines that name a thread are attributed to the communicator that thread is initialising: the one
opened by an ``nRanks``/``Init START`` line, or, in the older format where the comm line comes
last, the next ``Init COMPLETE`` on that thread. Lines with no such comm keep ``comm_id`` null.

A line cut off mid-text (the file ends without its newline, another process's prefix starts
inside the message, or a message ends where its format cannot: a key without its value, a
``Trees`` item or an arrow half written) is parsed as far as it goes and named in a warning
with its file and line number.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from tracekit.ingest import nccl_lines as lines

_MAX_CUT_NAMED = 3  # cut lines named in the warning; the rest are counted


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


class Parser:
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
        start = lines.HEADER_START.search(text)
        if start is None:
            return False
        m = lines.HEADER.match(text, start.start())
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
                "group": lines.int_or_none(m.group("group")),
                "file": self.where[0],
                "line": self.where[1],
            }
        )
        return True

    # -- one line ---------------------------------------------------------------------------
    def line(self, text: str, file_idx: int, file_name: str) -> None:
        """Parse one decoded line."""
        if "NCCL version" in text:
            m = lines.VERSION.search(text)
            if m and m.group(1) not in self.versions:
                self.versions.append(m.group(1))
        m = lines.last_prefix(text)
        if m is None:
            return
        first = lines.PREFIX.search(text)
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
        srcloc = lines.SRCLOC.match(msg)
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
        m = lines.COMM.search(msg)
        if m is None:
            return
        comm_id, rest = m.group(1), m.group(4)
        last = rest.split()[-1] if rest.split() else ""
        if last and any(k.startswith(last) for k in lines.COMM_KEYS):  # a key without its value
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
        for name, value in lines.COMM_KV.findall(rest):
            lines.set_comm_field(row, name, value)
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
        m = lines.RING.match(msg)
        if m is None:
            self._transport(msg, host, pid, thread)
            return
        order = [int(x) for x in m.group(3).split()]
        self._add(self.rings, thread, (host, pid, int(m.group(1)), int(m.group(2)), order))

    def _ring_line(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = lines.RING_LINK.match(msg)
        if m is None:
            self._transport(msg, host, pid, thread)
            return
        self._add(
            self.links,
            thread,
            (host, pid, int(m.group(1)), int(m.group(3)), int(m.group(2)), int(m.group(4))),
        )

    def _transport(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = lines.TRANSPORT.match(msg)
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
        rest = lines.TREE_ALT.sub("", lines.TREE_ITEM.sub("", msg[len("Trees ") :]))
        if re.search(r"[\d\[\]>-]", rest):  # a half-written item after the whole ones
            self.cut_line("Trees line cut off", msg)
        for m in lines.TREE_ITEM.finditer(msg):
            left, me, right = m.group(2), int(m.group(3)), m.group(4)
            if "/" in right and "/" not in left:  # 2.4-2.6: up->me->down0/down1/down2
                up, down = int(left), lines.ranks(right)
            else:  # down0/down1/down2->me->up
                up, down = int(right), lines.ranks(left)
            self._tree_row(host, pid, thread, int(m.group(1)), me, up, down)

    def _tree_line(self, msg: str, host: str | None, pid: int | None, thread: tuple) -> None:
        m = lines.TREE_LINE.match(msg)
        if m is not None:  # Tree c : up -> me -> downs
            self._tree_row(
                host,
                pid,
                thread,
                int(m.group(1)),
                int(m.group(3)),
                int(m.group(2)),
                lines.ranks(m.group(4)),
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
        m = lines.TUNING.match(msg)
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
                "op": lines.OPS.get(op, lines.snake(op)) if op else None,
                "bytes": int(m.group("bytes")),
                "algo": lines.enum_name(m.group("algo"), lines.ALGOS),
                "proto": lines.enum_name(m.group("proto"), lines.PROTOS),
                "time_us": float(time) if time else None,
                "channel_lo": lines.int_or_none(m.group("lo")),
                "channel_hi": lines.int_or_none(m.group("hi")),
            }
        )
