"""Event names built to collide in the C scanner's former intern table (issue #24).

Until issue #24 the scanner (tracekit/ingest/_kscan.c) interned texts in a linear-probing table
keyed by unseeded 32-bit FNV-1a, ``h = (h ^ byte) * 16777619 mod 2^32`` from the offset basis
2166136261. Anyone can compute that function, so a trace can carry names that all hash alike:
each new name then walks past every earlier one (n^2 probes, each a full compare).

The construction is the classic one for iterated hashes: from the hash state ``s_i`` reached
by the blocks chosen so far, a search over 4-character blocks finds two blocks
``a_i != b_i`` that lead to the same state ``s_{i+1}``. The 2^k strings that pick ``a_i`` or
``b_i`` at each of k positions then share one full 32-bit hash, and they are as long as each
other (4k letters and digits: no escapes, so the scanner reads them as they are).
"""

from __future__ import annotations

import itertools
import json
import random
import string
from pathlib import Path

FNV_BASIS = 2166136261
FNV_PRIME = 16777619
_MASK = 0xFFFFFFFF
_ALPHABET = (string.ascii_letters + string.digits).encode()


def fnv1a(data: bytes, state: int = FNV_BASIS) -> int:
    """32-bit FNV-1a of DATA from STATE (the scanner's former hash of a text)."""
    for byte in data:
        state = ((state ^ byte) * FNV_PRIME) & _MASK
    return state


def _colliding_pair(state: int) -> tuple[bytes, bytes, int]:
    """Two different 4-character blocks that take STATE to the same next state: (a, b, next).

    The last byte is xor-ed into the low 8 bits only, then the state is multiplied by an odd
    number (a bijection): two 3-character prefixes whose states agree on bits 8-31 collide
    once their last characters differ by the xor of the states' low bytes. A birthday search
    over 2^24 finds such prefixes after a few thousand."""
    by_top: dict[int, list[tuple[bytes, int]]] = {}
    for chars in itertools.product(_ALPHABET, repeat=3):
        prefix = bytes(chars)
        here = fnv1a(prefix, state)
        for other, there in by_top.get(here >> 8, []):
            x = (here ^ there) & 0xFF
            for d in _ALPHABET:
                if d ^ x in _ALPHABET:
                    a, b = prefix + bytes((d,)), other + bytes((d ^ x,))
                    return a, b, fnv1a(a, state)
        by_top.setdefault(here >> 8, []).append((prefix, here))
    raise AssertionError("no colliding blocks from this state")  # 62^3 prefixes: never


def colliding_names(bits: int) -> list[str]:
    """2^BITS distinct names of 4 * BITS letters and digits with one and the same FNV-1a hash."""
    state, pairs = FNV_BASIS, []
    for _ in range(bits):
        a, b, state = _colliding_pair(state)
        pairs.append((a, b))
    return [b"".join(choice).decode() for choice in itertools.product(*pairs)]


def random_names(count: int, length: int, seed: int = 1) -> list[str]:
    """COUNT distinct random names of LENGTH letters: the same sizes, no planted collision."""
    rng, names = random.Random(seed), set()
    while len(names) < count:
        names.add("".join(rng.choice(string.ascii_lowercase) for _ in range(length)))
    return sorted(names)


def trace_bytes(names: list[str]) -> bytes:
    """A one-rank Kineto trace with one complete event per name (1 us apart), as JSON bytes."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": float(i), "dur": 0.5}
        for i, n in enumerate(names)
    ]
    doc = {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    return json.dumps(doc, separators=(",", ":")).encode()


def write_trace(path: Path, names: list[str]) -> Path:
    path.write_bytes(trace_bytes(names))
    return path
