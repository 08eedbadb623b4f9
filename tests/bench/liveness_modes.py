"""What each liveness check sees when a node's slurmd is frozen, killed, or its network is gone.

    python tests/bench/liveness_modes.py [--node gpu04] [--stop-s 40] [--watch-s 45]

Run as root with the local cluster up (``eval "$(bash deploy/localcluster.sh env)"``,
no job on ``--node``). Three scenarios, each printed as a timeline (seconds after
the event) of the first time each check changed its answer:

- ``stop``: SIGSTOP the node's slurmd for ``--stop-s``, then SIGCONT. Checks: a TCP
  connect to its slurmd port (b300.liveness.tcp), ``scontrol show slurmd`` sent to that
  node (``SLURMD_NODENAME``: a munge-authenticated RPC any user may send, answered by
  slurmd itself; multiple-slurmd builds only), and ``sinfo`` (slurmctld's own ping).
  Also the slurmd port's accept queue (``ss``) and the lines slurmd logs after SIGCONT.
- ``kill``: ``localcluster.sh kill-node`` (slurmd killed -9), then ``restart-node``.
- ``silent``: a port whose accept queue is full (a listener that never accepts): the
  kernel drops every new SYN, as a powered-off host or a cut network answers nothing.
  Checked by TCP connect and by an SSH connect (paramiko) to it.
- ``netns``: in a network namespace of its own (``ip netns``, deleted after), a listener
  on the namespace's loopback behind nftables rules: none, ``drop`` (a firewall or a dead
  host: silence), ``reject with tcp reset``, ``reject with icmp host-unreachable`` (a
  router's word for a host that does not answer ARP), and the namespace's loopback
  link down. Shows the prober's outcome for each, and the SSH connect's.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from b300.liveness.tcp import TcpProber
from b300.liveness.verdicts import Target

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "localcluster.sh"


class Timeline:
    """The answers of each check over time, and when each one first changed."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.last: dict[str, str] = {}
        self.changes: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()

    def see(self, check: str, answer: str) -> None:
        with self.lock:
            if self.last.get(check) != answer:
                self.last[check] = answer
                self.changes.append((time.monotonic(), check, answer))

    def mark(self, what: str) -> None:
        """Record an event; the first one is the zero of the timeline."""
        if not any(check == "event" for _, check, _ in self.changes):
            self.t0 = time.monotonic()
        self.see("event", what)

    def print(self, title: str) -> None:
        print(f"\n== {title} (seconds after the event; negative: the answer before it)")
        for t, check, answer in self.changes:
            print(f"  {t - self.t0:7.2f} s  {check:<22} {answer}")


def _slurmd_pid(node: str) -> int:
    conf = os.environ["SLURM_CONF"]
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if not comm.read_text().startswith("slurmd"):
                continue
            args = (comm.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-N" in args and args[args.index(b"-N") + 1].decode() == node and conf.encode() in args:
            return int(comm.parent.name)
    raise SystemExit(f"no slurmd for {node}")


def _slurmd_port(node: str) -> int:
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    m = re.search(r"\bPort=(\d+)", out)
    assert m, out
    return int(m.group(1))


def _watch(tl: Timeline, node: str, port: int, stop: threading.Event) -> list[threading.Thread]:
    prober = TcpProber(timeout_s=0.8)
    target = Target(node, "127.0.0.1", port)

    def tcp() -> None:
        while not stop.is_set():
            r = prober.check([target], 1.0)[0]
            tl.see("tcp connect", r.outcome.value + (f" ({r.detail})" if r.detail else ""))
            stop.wait(0.5)

    def show_slurmd() -> None:
        env = {**os.environ, "SLURMD_NODENAME": node}
        while not stop.is_set():
            t = time.monotonic()
            p = subprocess.run(["scontrol", "show", "slurmd"], capture_output=True, text=True, env=env,
                               timeout=60)
            took = time.monotonic() - t
            ok = p.returncode == 0 and "Slurmd PID" in p.stdout
            err = (p.stderr.strip().splitlines() or [""])[-1][:60]
            tl.see("scontrol show slurmd", "answered" if ok else f"failed after {took:.1f} s: {err}")
            stop.wait(0.5)

    def sinfo() -> None:
        while not stop.is_set():
            p = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True,
                               text=True, timeout=30)
            tl.see("sinfo state", p.stdout.strip() or p.stderr.strip()[:60])
            stop.wait(0.5)

    threads = [threading.Thread(target=f, daemon=True) for f in (tcp, show_slurmd, sinfo)]
    for th in threads:
        th.start()
    return threads


def _accept_queue(port: int) -> str:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=10).stdout.split()
    return f"Recv-Q {out[1]} of backlog {out[2]}" if len(out) >= 3 else "?"


def _healthy(node: str) -> None:
    """Bring ``node`` back to idle (bounded) before a scenario starts."""
    def state() -> str:
        return subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    if state() != "idle":
        subprocess.run(["bash", str(CLUSTER), "up"], timeout=180, capture_output=True, check=True)
    deadline = time.monotonic() + 60
    while state() != "idle":
        if time.monotonic() > deadline:
            raise SystemExit(f"{node} not idle after 60 s: {state()}")
        time.sleep(0.5)


def _scenario(title: str, node: str, port: int, watch_s: float, act: object) -> None:
    _healthy(node)
    tl = Timeline()
    stop = threading.Event()
    threads = _watch(tl, node, port, stop)
    time.sleep(3)  # the baseline answers first
    assert callable(act)
    act(tl)
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
    stop.set()
    for th in threads:
        th.join(70)
    tl.print(title)


def stop_scenario(node: str, port: int, stop_s: float, watch_s: float) -> None:
    pid = _slurmd_pid(node)
    log = Path(os.environ["SLURM_CONF"]).parent.parent / "log" / f"slurmd-{node}.log"
    state: dict[str, object] = {}

    def act(tl: Timeline) -> None:
        os.kill(pid, signal.SIGSTOP)
        tl.mark(f"SIGSTOP slurmd {pid}")

        def thaw() -> None:
            time.sleep(stop_s)
            state["queue"] = _accept_queue(port)
            state["lines"] = len(log.read_text().splitlines())
            os.kill(pid, signal.SIGCONT)
            tl.mark(f"SIGCONT (accept queue was {state['queue']})")
        threading.Thread(target=thaw, daemon=True).start()

    try:
        _scenario(f"stop: slurmd of {node} SIGSTOPped for {stop_s:g} s", node, port, watch_s, act)
    finally:
        os.kill(pid, signal.SIGCONT)
    after = log.read_text().splitlines()[int(str(state.get("lines", 0))):]
    zero = sum("Zero Bytes" in line or "Connection reset" in line for line in after)
    print(f"  slurmd logged {len(after)} lines after SIGCONT, {zero} of them about our closed connects")


def kill_scenario(node: str, port: int, watch_s: float) -> None:
    def act(tl: Timeline) -> None:
        subprocess.run(["bash", str(CLUSTER), "kill-node", node], check=True, timeout=60,
                       capture_output=True)
        tl.mark("kill-node (slurmd killed -9)")
    try:
        _scenario(f"kill: {node} crashed", node, port, watch_s, act)
    finally:
        subprocess.run(["bash", str(CLUSTER), "restart-node", node], timeout=120, capture_output=True)


def silent_scenario() -> None:
    import paramiko
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue (backlog 0 holds one)
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.5)
    print(f"\n== silent: a port whose accept queue is full ({_accept_queue(port)})")
    prober = TcpProber(timeout_s=0.8)
    for _ in range(3):
        r = prober.check([Target("silent", "127.0.0.1", port)], 1.0)[0]
        print(f"  tcp connect: {r.outcome.value} after {r.latency_s:.2f} s {r.detail}")
    t = time.monotonic()
    try:
        c = paramiko.SSHClient()
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect("127.0.0.1", port=port, username="root", timeout=1.5, banner_timeout=1.5,
                  auth_timeout=1.5, allow_agent=False, look_for_keys=False)
        print("  ssh connect: answered (unexpected)")
    except Exception as exc:
        print(f"  ssh connect: {type(exc).__name__} after {time.monotonic() - t:.2f} s: {exc}")
    for s in fillers:
        s.close()
    listener.close()


_NETNS_INNER = r"""
import socket, subprocess, sys, threading, time
import paramiko
from b300.liveness.verdicts import Target
from b300.liveness.tcp import TcpProber
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4096); port = srv.getsockname()[1]
def serve():
    while True:
        try:
            c, _ = srv.accept(); c.close()
        except OSError:
            return
threading.Thread(target=serve, daemon=True).start()
def nft(*args):
    subprocess.run(["nft", *args], check=True)
nft("add", "table", "inet", "b300"); nft("add", "chain", "inet", "b300", "in",
    "{ type filter hook input priority 0 ; }")
prober = TcpProber(timeout_s=0.8)
cases = [("no rule", None), ("drop", "drop"), ("reject with tcp reset", "reject with tcp reset"),
         ("reject with icmp host-unreachable", "reject with icmp type host-unreachable"),
         ("loopback link down", "LINKDOWN")]
for label, verdict in cases:
    if verdict == "LINKDOWN":
        subprocess.run(["ip", "link", "set", "lo", "down"], check=True)
    elif verdict:
        nft("add", "rule", "inet", "b300", "in", "tcp", "dport", str(port), *verdict.split())
    outs = [prober.check([Target("n", "127.0.0.1", port)], 1.0)[0] for _ in range(3)]
    t = time.monotonic()
    try:
        c = paramiko.SSHClient(); c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect("127.0.0.1", port=port, username="x", timeout=1.5, banner_timeout=1.5,
                  auth_timeout=1.5, allow_agent=False, look_for_keys=False)
        ssh = "connected"
    except paramiko.SSHException as exc:
        ssh = f"answered, not an sshd ({exc})"[:60]
    except Exception as exc:
        ssh = f"{type(exc).__name__} after {time.monotonic() - t:.2f} s"
    def show(o):
        why = o.detail.split(" ")[0] if o.detail.startswith("E") else o.detail
        return f"{o.outcome.value} {o.latency_s * 1000:.1f} ms" + (f" ({why})" if why else "")
    print(f"  {label:<36} tcp: " + ", ".join(show(o) for o in outs) + f"; ssh: {ssh}", flush=True)
    nft("flush", "chain", "inet", "b300", "in")
"""


def netns_scenario() -> None:
    name = "b300liveness"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        print("\n== netns: a listener on a namespace's loopback behind nftables rules "
              "(3 checks each; ssh: paramiko connect to the same port)")
        proc = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", _NETNS_INNER],
                              capture_output=True, text=True, timeout=120)
        print(proc.stdout.rstrip() or proc.stderr[-2000:])
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", default="gpu04")
    ap.add_argument("--stop-s", type=float, default=40.0)
    ap.add_argument("--watch-s", type=float, default=45.0)
    ap.add_argument("--only", choices=["stop", "kill", "silent", "netns"])
    args = ap.parse_args()
    if not re.fullmatch(r"gpu\d{2}", args.node):
        raise SystemExit(f"bad node {args.node!r}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            timeout=30).stdout.splitlines()
    print("; ".join(" ".join(line.split()) for line in config
                    if line.startswith(("SlurmdTimeout", "MessageTimeout", "SLURM_VERSION"))))
    if args.only in (None, "netns"):
        netns_scenario()
    if args.only == "netns":
        return 0
    port = _slurmd_port(args.node)
    if args.only in (None, "silent"):
        silent_scenario()
    if args.only in (None, "stop"):
        stop_scenario(args.node, port, args.stop_s, args.watch_s)
    if args.only in (None, "kill"):
        kill_scenario(args.node, port, args.watch_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
