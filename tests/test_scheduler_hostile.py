"""`--scheduler` pointed at things that are not a Dask scheduler (issue #24 item 4): a listener
that accepts and never speaks, a server that answers HTTP 400 and closes, nothing listening, a
peer whose first message carries a pickle. Each is one line and exit 2 within the connect
timeout and a few seconds, Ctrl-C during the wait ends it at once, and nothing the peer sent is
unpickled. Real sockets, served by a thread of this process; a real TLS scheduler for tls://."""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run_cli

from tracekit.engines import open_executor
from tracekit.errors import TracekitError

distributed = pytest.importorskip("distributed")

RUN = SAMPLES / "dp"
CLI_BOUND_S = 10 + 50  # the CLI's 10 s connect timeout, and interpreter start-up on a busy machine


class Peer:
    """A TCP listener on 127.0.0.1 whose every connection is handed to ``serve`` in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = threading.Event()
        self.held: list[socket.socket] = []
        self._serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self.accepted.set()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        for conn in [*self.held, self.sock]:
            conn.close()


def silent(conn: socket.socket) -> None:
    """Accepts and never speaks (the connection stays open)."""


def http_400(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    conn.close()


class Payload:
    """Unpickling it creates its file: proof that the peer's bytes ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (open, (str(self.marker), "w"))


def pickling(marker: Path) -> Callable[[socket.socket], None]:
    """Sends Dask's handshake with a pickled object inside, framed as Dask frames it."""
    from distributed.comm.tcp import _add_frames_header
    from distributed.comm.utils import to_frames
    from distributed.protocol import to_serialize

    msg = {"compression": None, "python": (3, 11, 0), "pickle-protocol": 5}
    msg["x"] = to_serialize(Payload(marker))
    frames, _, _ = _add_frames_header(asyncio.run(to_frames(msg, serializers=["pickle"])))

    def serve(conn: socket.socket) -> None:
        conn.sendall(b"".join(bytes(f) for f in frames))

    return serve


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> Iterator[Peer]:
    p = Peer(request.param)
    yield p
    p.close()


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("peer", "words"),
    [(silent, "no Dask handshake within 2 s"), (http_400, "not a Dask scheduler")],
    indirect=["peer"],
)
def test_a_peer_that_is_not_dask_is_one_line_within_the_timeout(peer: Peer, words: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TracekitError) as err:
        with open_executor(peer.address, connect_timeout=2):
            pass
    assert time.monotonic() - t0 < 2 + 20
    assert str(err.value).startswith(f"cannot reach the Dask scheduler at {peer.address}: ")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("peer", [silent, http_400, None], indirect=True, ids=str)
def test_the_cli_says_one_line_and_exits_2(peer: Peer, tmp_path: Path) -> None:
    address = peer.address if peer._serve is not None else free_address()
    t0 = time.monotonic()
    done = run_cli("analyze", str(RUN), "--scheduler", address, "--out", str(tmp_path / "a"))
    took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"tracekit: cannot reach the Dask scheduler at {address}: ")
    assert took < CLI_BOUND_S
    assert not (tmp_path / "a").exists()


def test_a_pickle_in_the_first_message_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    peer = Peer(pickling(marker))
    try:
        with pytest.raises(TracekitError, match="not a Dask scheduler"):
            with open_executor(peer.address, connect_timeout=5):
                pass
    finally:
        peer.close()
    assert not marker.exists(), "the peer's pickle was loaded"
    pickle.loads(pickle.dumps(Payload(marker)))  # the payload does run when loaded
    assert marker.exists()


def test_ctrl_c_during_the_wait_ends_it_at_once(tmp_path: Path) -> None:
    peer = Peer(silent)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracekit.cli", "analyze", str(RUN), "--scheduler"]
            + [peer.address, "--out", str(tmp_path / "a")],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert peer.accepted.wait(CLI_BOUND_S), "tracekit never connected"
        time.sleep(0.5)  # in the wait for the handshake
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("Ctrl-C did not end the wait within 5 s")
        took = time.monotonic() - t0
    finally:
        peer.close()
    assert proc.returncode == 130, err
    assert [line for line in err.splitlines() if line.strip()] == ["tracekit: interrupted"]
    assert took < 5


# --- tls:// with Dask's TLS settings ---------------------------------------------------------


@pytest.fixture(scope="module")
def tls_scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real Dask scheduler on tls://127.0.0.1:PORT with a self-signed certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj"]
        + ["/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    port = int(free_address().rsplit(":", 1)[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls"]
        + ["--host", "127.0.0.1", "--port", str(port), "--no-dashboard", "--tls-ca-file"]
        + [str(cert), "--tls-cert", str(cert), "--tls-key", str(key)],
        cwd=d,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the TLS scheduler never started")
            time.sleep(0.5)
    yield f"tls://127.0.0.1:{port}", d
    proc.terminate()
    proc.wait(30)


@pytest.mark.slow(reason="a Dask scheduler with TLS")
def test_tls_uses_dasks_security_settings(tls_scheduler: tuple[str, Path]) -> None:
    import dask

    address, d = tls_scheduler
    with pytest.raises(TracekitError, match="tls:// needs Dask's TLS settings"):
        with open_executor(address, connect_timeout=5):
            pass
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    # Dask's own config, as DASK_DISTRIBUTED__COMM__TLS__CA_FILE=... and so on would set it
    tls = {"ca-file": cert, "client.cert": cert, "client.key": key}
    with dask.config.set({f"distributed.comm.tls.{k}": v for k, v in tls.items()}):
        with open_executor(address, connect_timeout=20) as (_, info):
            assert info.kind == "dask" and info.address == address
