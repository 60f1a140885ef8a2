"""An emulated multi-node network on one machine: one Linux network namespace per node.

``tracekit run ... --nodes K --emulate-network --inter-node-bandwidth RATE`` runs every node's
torchrun agent inside a network namespace of its own, exactly as on a cluster: each agent joins
a real multi-node c10d rendezvous over the emulated network, and the ranks' gloo connections
between nodes cross a shaped link, while ranks of one node reach each other over that
namespace's loopback (traffic to a local address never leaves the namespace), unshaped.

    hub namespace   tk<pid>h     bridge tkbr, one port tkp<k> per node
    node namespace  tk<pid>n<k>  lo, and veth tkn<k> with 10.213.0.<100+k>/24; its peer tkp<k>
                                 is the bridge port in the hub
    shaping         tc tbf rate RATE on tkn<k> (what node k sends) and on tkp<k> (what it
                    receives): every node has a full-duplex NIC of RATE, like a cluster's
                    Ethernet; tbf, since only tbf/htb/pfifo qdiscs exist here (no netem)

Why 10.213.0.<100+k>: torchrun's c10d rendezvous numbers the agents by sorting their
``--local-addr`` strings, and three-digit last octets sort as numbers, so node k gets group
rank k and global ranks k*N/K .. (k+1)*N/K-1, the contiguous placement run.json records.
Nothing here touches the host's interfaces or sends to an address it did not create: the veth
pairs are created inside the namespaces (``ip -n NS link add ... peer ... netns HUB``).

Clean-up, always: ``close()`` kills what still runs inside the namespaces (``ip netns pids``),
deletes the node namespaces (which destroys their veths) and the hub. The launcher calls it in a
``finally`` and turns SIGTERM/SIGHUP into an exception so that the ``finally`` runs; a launcher
killed with SIGKILL leaves its namespaces, which the next ``EmulatedNetwork`` sweeps
(``sweep()``: namespaces named tk<pid>... whose launcher pid is gone).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError

SUBNET = "10.213.0"
PREFIX = 24
HOST_OFFSET = 100  # node k's address is SUBNET.<100+k>: sorts as a number (see above)
MAX_NODES = 99
RDZV_PORT = 29400
_NAME = re.compile(r"^tk(\d+)(?:n\d+|h)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}


def rate_bits(rate: str) -> float:
    """tc's rate syntax -> bits per second (tc: ``mbit`` is 10^6 bit/s, ``mbps`` 10^6 bytes/s)."""
    m = _RATE.match(str(rate).strip().lower())
    if not m:
        raise TracekitError(
            f"--inter-node-bandwidth {rate!r} is not a tc rate such as 400mbit or 1gbit"
        )
    return float(m[1]) * _RATE_UNITS[m[2]]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "--emulate-network needs Linux network namespaces"
    if os.geteuid() != 0:
        return "--emulate-network needs root (to create network namespaces); run without it for logical nodes only"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"--emulate-network needs iproute2 ('{tool}' not found); install it or run without --emulate-network"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def our_namespaces() -> list[str]:
    """Every namespace whose name has this module's shape (tk<pid>h, tk<pid>n<k>)."""
    out = _ip("netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if _NAME.match(n)]


def _kill_inside(names: list[str], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process inside these namespaces (ours by construction)."""

    def pids() -> list[int]:
        found = []
        for ns in names:
            out = _ip("netns", "pids", ns, check=False).stdout
            found += [int(p) for p in out.split() if p.isdigit()]
        return [p for p in found if p != os.getpid()]

    todo = pids()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in todo:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            todo = pids()
            if not todo:
                return
            time.sleep(0.05)


def _delete(names: list[str]) -> None:
    _kill_inside(names)
    for ns in sorted(names, key=lambda n: n.endswith("h")):  # nodes first, then the hub
        _ip("netns", "delete", ns, check=False)


def sweep() -> list[str]:
    """Delete namespaces left by launchers that no longer run (e.g. killed with SIGKILL)."""
    stale = [n for n in our_namespaces() if not _pid_alive(int(_NAME.match(n)[1]))]
    if stale:
        _delete(stale)
    return stale


@dataclass
class EmulatedNetwork:
    """K node namespaces joined through a hub bridge, inter-node links shaped to ``rate``."""

    nodes: int
    rate: str = "1gbit"
    owner: int = field(default_factory=os.getpid)
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise TracekitError(
                f"--emulate-network supports 1 to {MAX_NODES} nodes, not {self.nodes}"
            )
        rate_bits(self.rate)

    # names and addresses
    @property
    def hub(self) -> str:
        return f"tk{self.owner}h"

    def namespace(self, k: int) -> str:
        return f"tk{self.owner}n{k}"

    @staticmethod
    def interface(k: int) -> str:
        return f"tkn{k}"

    @staticmethod
    def address(k: int) -> str:
        return f"{SUBNET}.{HOST_OFFSET + k}"

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.address(0)}:{RDZV_PORT}"

    def _tbf(self, ns: str, dev: str) -> None:
        bits = rate_bits(self.rate)
        burst = max(64 * 1024, int(bits / 8 * 0.002))  # 2 ms at line rate, and a GSO packet
        _ip(
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            self.rate,
            "burst",
            str(burst),
            "latency",
            "100ms",
        )

    # life cycle
    def open(self) -> EmulatedNetwork:
        """Create the namespaces, veths, bridge and shaping; on any failure remove what was made."""
        reason = unavailable()
        if reason:
            raise TracekitError(reason)
        sweep()
        try:
            self._add(self.hub)
            _ip("-n", self.hub, "link", "add", "tkbr", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "tkbr", "up")
            for k in range(self.nodes):
                ns, dev, port = self.namespace(k), self.interface(k), f"tkp{k}"
                self._add(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip(
                    "-n",
                    ns,
                    "link",
                    "add",
                    dev,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    port,
                    "netns",
                    self.hub,
                )
                _ip("-n", ns, "addr", "add", f"{self.address(k)}/{PREFIX}", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", self.hub, "link", "set", port, "master", "tkbr")
                _ip("-n", self.hub, "link", "set", port, "up")
                self._tbf(ns, dev)  # what node k sends
                self._tbf(self.hub, port)  # what node k receives
        except subprocess.CalledProcessError as exc:
            self.close()
            msg = (exc.stderr or "").strip().splitlines()
            raise TracekitError(
                f"--emulate-network: '{' '.join(exc.cmd)}' failed: {msg[-1] if msg else exc}"
            ) from None
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)

    def close(self) -> None:
        """Kill what runs inside, delete every namespace made (idempotent)."""
        if self.created:
            _delete(list(self.created))
            self.created.clear()

    def __enter__(self) -> EmulatedNetwork:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # running inside
    def wrap(self, k: int, cmd: list[str]) -> list[str]:
        """``cmd`` run inside node k's namespace."""
        return ["ip", "netns", "exec", self.namespace(k), *cmd]

    def env(self, k: int, backend: str = "gloo") -> dict[str, str]:
        """Variables that make node k's ranks talk over its veth (gloo picks the interface from
        GLOO_SOCKET_IFNAME; NCCL would otherwise see one host and use shared memory)."""
        env = {"GLOO_SOCKET_IFNAME": self.interface(k), "TRACEKIT_EMULATED_NODE": str(k)}
        if backend == "nccl":
            env.update(
                NCCL_SOCKET_IFNAME=self.interface(k), NCCL_HOSTID=f"tk-node{k}", NCCL_IB_DISABLE="1"
            )
        return env

    def torchrun_args(self, k: int, run_id: str) -> list[str]:
        """torchrun's multi-node rendezvous options for node k (the agent of node 0 hosts the store)."""
        return [
            "--nnodes",
            str(self.nodes),
            "--node-rank",
            str(k),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            f"is_host={1 if k == 0 else 0}",
            "--local-addr",
            self.address(k),
        ]

    def describe(self) -> dict[str, object]:
        """What run.json records under launch.network."""
        return {
            "kind": "linux network namespaces",
            "rate": self.rate,
            "rate_bits_per_s": rate_bits(self.rate),
            "shaping": "tc tbf on every node's veth, both directions",
            "subnet": f"{SUBNET}.0/{PREFIX}",
            "nodes": [
                {
                    "node": k,
                    "namespace": self.namespace(k),
                    "interface": self.interface(k),
                    "address": self.address(k),
                }
                for k in range(self.nodes)
            ],
            "rdzv_endpoint": self.rdzv_endpoint,
        }
