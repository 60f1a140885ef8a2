"""Where per-rank tasks run: one ``concurrent.futures`` Executor interface, three engines.

- ``"threads"`` (the default): a thread pool in this process. Ingest's heavy parts (gunzip,
  the C scanner, polars) release the GIL, so threads divide a parse among the cores.
- ``"processes"``: spawned local processes (never forked: polars' threads would be copied in
  whatever state they were in). The task and its arguments must be importable and picklable.
- any other string is a **Dask** scheduler address (``tcp://HOST:8786``, ``tls://...``):
  ``distributed.Client(address)`` through its own Executor (``client.get_executor()``). Dask
  does the distribution, retries and serialisation; tracekit runs no scheduler or RPC of its
  own. Workers read the traces from the path they share with the driver. ``dask-jobqueue``
  starts such a cluster under Slurm, ``dask-kubernetes`` on Kubernetes (docs/cluster.md).

The address defaults to ``$TRACEKIT_SCHEDULER``; tracekit connects nowhere else. A scheduler
address is code execution by Dask's design (its messages carry pickles): name only a scheduler
you trust, over tls:// with Dask's TLS settings where the network is shared. Dask is optional
(``pip install 'tracekit-dist[cluster]'``) and imported only when an address is given.

Failures are one line (:class:`~tracekit.errors.TracekitError`), never a traceback or a hang:
a scheduler that does not answer within ``connect_timeout`` seconds is named with the problem;
a worker that dies while running a task is retried by Dask on another worker (up to Dask's
``distributed.scheduler.allowed-failures``), then reported; a lost scheduler is reported.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from concurrent.futures import CancelledError, Executor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from typing import Any

from tracekit import stopping
from tracekit.errors import TracekitError
from tracekit.summary.schema import Engine

SCHEDULER_ENV = "TRACEKIT_SCHEDULER"
LOCAL_ENGINES = ("threads", "processes")
CONNECT_TIMEOUT_S = 10.0  # a scheduler that has not answered by then is reported, not awaited
INSTALL_HINT = "pip install 'tracekit-dist[cluster]' (from a clone: pip install -e '.[cluster]')"


def resolve(scheduler: str | None) -> str | None:
    """The engine asked for: ``scheduler``, else ``$TRACEKIT_SCHEDULER``, else None (none asked
    for: the caller keeps its own default)."""
    chosen = scheduler if scheduler is not None else os.environ.get(SCHEDULER_ENV)
    chosen = (chosen or "").strip()
    return chosen or None


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def open_executor(
    scheduler: str | None = None,
    workers: int | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> Iterator[tuple[Executor, Engine]]:
    """An Executor for per-rank tasks and what it is; shut down (or disconnected) on exit.

    ``scheduler``: "threads", "processes" or a Dask scheduler address (default
    ``$TRACEKIT_SCHEDULER``, else "threads"). ``workers``: the local pool's size (default: the
    usable CPUs); a Dask cluster has the workers it has. Engine failures inside the ``with``
    block (a dead worker, a lost scheduler) leave it as one-line TracekitErrors.
    """
    chosen = resolve(scheduler) or "threads"
    if chosen in LOCAL_ENGINES:
        n = max(1, workers or usable_cpus())
        info = Engine(chosen, None, n)
        pool: Executor = (
            stopping.ThreadPool(n, "tracekit-rank")
            if chosen == "threads"
            else stopping.ProcessPool(n, _spawn_context())
        )
        with pool, _one_line(info):
            yield pool, info
        return
    _require_dask(chosen)  # before muting: importing distributed sets its loggers' levels
    with _dask_logs_muted():
        client = _connect(chosen, connect_timeout)
        try:
            _check_versions(client, chosen)
            info = Engine("dask", chosen, len(client.nthreads()))
            with _one_line(info):
                # pure=False: a task reads a file that may change, so no result is shared by key
                yield client.get_executor(pure=False), info
        finally:
            with suppress(Exception):  # a scheduler that is gone: nothing to disconnect from
                client.close(timeout=connect_timeout)


def _spawn_context() -> Any:
    import multiprocessing  # here: a plain analysis never starts a process

    return multiprocessing.get_context("spawn")


def _run_async(coroutine: Any) -> Any:
    import asyncio  # here: only a Dask engine needs it (30-80 ms to import)

    return asyncio.run(coroutine)


def _check_versions(client: Any, address: str) -> None:
    """Every worker runs the driver's tracekit (tasks are sent by reference: another version's
    functions would fail with a traceback of theirs), else a one-line TracekitError."""
    from tracekit._version import __version__

    try:  # a lambda travels by value: it runs even where tracekit is not installed
        seen = client.run(lambda: getattr(__import__("tracekit"), "__version__", None))
    except ImportError:
        seen = {"a worker": None}
    except Exception:  # noqa: BLE001 - a worker that cannot answer: let the tasks tell
        return
    other = {w: v for w, v in seen.items() if v != __version__}
    if other:
        worker, version = sorted(other.items(), key=str)[0]
        has = f"tracekit {version}" if version else "no tracekit"
        raise TracekitError(
            f"workers of the Dask cluster at {address} do not run this tracekit ({worker} has "
            f"{has}, this one {__version__}): install the same version on every worker"
        )


@contextmanager
def _dask_logs_muted() -> Iterator[None]:
    """Dask's loggers in this process (the driver's client) below CRITICAL silenced while the
    engine is open: tracekit reports a lost scheduler or dead workers in its own one line,
    where Dask's client would log each reconnect attempt with a traceback. The workers' and
    the scheduler's own logs are untouched."""
    names = ["distributed"]
    names += [n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def _require_dask(address: str) -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise TracekitError(
            f"--scheduler {address} needs Dask distributed, which is not installed: {INSTALL_HINT}"
        ) from None


def _connect(address: str, timeout: float) -> Any:
    """A ``distributed.Client`` connected to ``address``, or a one-line TracekitError.

    tcp:// and tls:// are probed first by :func:`_probe` (plain sockets, in this thread: Ctrl-C
    ends the wait at once) until the peer has sent Dask's handshake, decoded without running
    anything: whatever else answers there (an HTTP server, a listener that never speaks) is
    one line within ``timeout``, and nothing it sent is unpickled. Only then does Dask's Client
    connect, and from then on a scheduler is trusted by Dask's design (its messages may carry
    pickles: a scheduler address is code execution, docs/cluster.md). TLS settings are Dask's
    own (``distributed.comm.tls.*`` in its config, ``DASK_DISTRIBUTED__COMM__TLS__*`` in the
    environment), used by the probe and the Client alike. Other schemes go to Dask's own
    probe, in a daemon thread (the caller may be inside an event loop, as in Jupyter).
    """
    from distributed import Client
    from distributed.security import Security

    security = Security()  # Dask's config: distributed.comm.tls.*, DASK_DISTRIBUTED__COMM__TLS__*

    def problem(err: BaseException) -> TracekitError:
        what = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return TracekitError(f"cannot reach the Dask scheduler at {address}: {what}")

    try:
        if address.startswith(("tcp://", "tls://")):
            _probe(address, timeout, security)
        else:
            _dask_probe(address, timeout, security)
    except Exception as err:  # any failure to reach it is the user's one line
        raise problem(err) from None
    try:
        return Client(address, timeout=timeout, set_as_default=False, security=security)
    except Exception as err:
        raise problem(err) from None


#: Dask's handshake is a small msgpack map; a peer announcing more is not a Dask scheduler
HANDSHAKE_MAX_BYTES = 64 << 10
HANDSHAKE_KEYS = frozenset({"compression", "python", "pickle-protocol"})


def _probe(address: str, timeout: float, security: Any) -> None:
    """Connect to a tcp:// or tls:// ``address``, send Dask's handshake and read the peer's
    (distributed.comm.core.connect: both sides write their handshake, then read): 8 bytes of length, the frame count and lengths, one msgpack map with
    HANDSHAKE_KEYS. Bounded in time (``timeout`` in all) and in bytes; decoded without any
    extension or object hook, so nothing it holds is unpickled or run. Raises OSError saying
    what came instead."""
    import socket
    import struct
    import time

    import msgpack  # type: ignore[import-untyped]  # Dask's own dependency
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, loc = parse_address(address)
    host, port = parse_host_port(loc)
    deadline = time.monotonic() + timeout
    late = f"no Dask handshake within {timeout:g} s (is it a Dask scheduler?)"

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OSError(late)
        return remaining

    def read(sock: socket.socket, n: int) -> bytes:
        got = b""
        while len(got) < n:
            sock.settimeout(left())
            try:
                chunk = sock.recv(n - len(got))
            except TimeoutError:
                raise OSError(late) from None
            if not chunk:
                raise OSError("closed the connection before Dask's handshake: not a Dask scheduler")
            got += chunk
        return got

    def not_dask(why: str) -> OSError:
        return OSError(f"not a Dask scheduler ({why})")

    try:
        raw = socket.create_connection((host, port), timeout=left())
    except TimeoutError:
        raise OSError(f"no answer within {timeout:g} s") from None
    with raw:
        sock = raw
        if scheme == "tls":
            ctx = security.get_connection_args("client").get("ssl_context")
            if ctx is None:
                raise OSError(
                    "tls:// needs Dask's TLS settings (distributed.comm.tls.ca-file, "
                    ".client.cert and .client.key, or DASK_DISTRIBUTED__COMM__TLS__*)"
                )
            raw.settimeout(left())
            sock = ctx.wrap_socket(raw, server_hostname=host if ctx.check_hostname else None)
        # ours first, as Dask's connect does (a server that waits for a request answers it)
        mine = msgpack.packb(
            {"compression": None, "python": tuple(sys.version_info[:3]), "pickle-protocol": 5}
        )
        sock.settimeout(left())
        sock.sendall(struct.pack("<QQQ", 16 + len(mine), 1, len(mine)) + mine)
        (total,) = struct.unpack("<Q", read(sock, 8))
        if not 16 <= total <= HANDSHAKE_MAX_BYTES:
            raise not_dask(f"its first bytes announce {total} bytes, not a handshake")
        body = read(sock, total)
        (count,) = struct.unpack_from("<Q", body)
        if count != 1:  # more frames: objects serialised out of band, never in a handshake
            raise not_dask(f"{count} frames in its handshake")
        lengths = struct.unpack_from(f"<{count}Q", body, 8)
        start = 8 * (1 + count)
        if start + sum(lengths) != total:
            raise not_dask("frame lengths that do not add up")
        try:  # no ext_hook, no object_hook: a pickle inside stays bytes
            msg = msgpack.unpackb(body[start : start + lengths[0]], raw=False, use_list=False)
        except Exception as err:  # noqa: BLE001 - msgpack raises several kinds on garbage
            raise not_dask(f"undecodable handshake: {type(err).__name__}") from None
        if not isinstance(msg, dict) or not HANDSHAKE_KEYS <= set(msg):
            raise not_dask("its first message is not Dask's handshake")
        if not all(_plain(v) for v in msg.values()):  # a serialised object: Dask would load it
            raise not_dask("its handshake carries an object, not settings")


def _plain(value: Any) -> bool:
    """A handshake setting: None, a number, a string, or a tuple of those (Python's version)."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _dask_probe(address: str, timeout: float, security: Any) -> None:
    """Dask's own connect and handshake (schemes other than tcp:// and tls://), in a daemon
    thread waited on for ``timeout`` + 5 s: a peer that never answers is never joined."""
    import queue
    import threading

    from distributed.comm import connect

    async def reach() -> None:
        comm = await connect(address, timeout=timeout, **security.get_connection_args("client"))
        await comm.close()

    done: queue.Queue[BaseException | None] = queue.Queue()

    def attempt() -> None:
        try:
            _run_async(reach())
            done.put(None)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            done.put(err)

    threading.Thread(target=attempt, name="tracekit-dask-probe", daemon=True).start()
    try:
        err = done.get(timeout=timeout + 5)
    except queue.Empty:
        raise OSError(f"no Dask handshake within {timeout:g} s") from None
    if err is not None:
        raise err


@contextmanager
def _one_line(info: Engine) -> Iterator[None]:
    """Engine failures as one-line TracekitErrors; the tasks' own errors pass unchanged."""
    where = f"the Dask cluster at {info.address}" if info.address else f"local {info.kind}"
    try:
        yield
    except BrokenProcessPool:
        raise TracekitError(
            "a worker process died while running a per-rank task (out of memory, or a script "
            "that calls tracekit without an `if __name__ == '__main__':` guard); try threads"
        ) from None
    except CancelledError:
        raise TracekitError(
            f"{where} cancelled the per-rank tasks (the scheduler went away or was restarted)"
        ) from None
    except Exception as err:
        dask = sys.modules.get("distributed")  # loaded whenever a Dask engine is open
        if dask is None or not isinstance(err, dask.KilledWorker):
            raise
        raise TracekitError(
            f"workers of {where} kept dying while running the per-rank task {err.args[0]!r} "
            "(out of memory, or killed): see the workers' logs"
        ) from None
