#!/usr/bin/env python3
"""The shipped node check: runs what the node has, skips what it lacks (saying so).

Standard library only: the triage job runs it on the node with ``python3 -`` (b300 need
not be installed there). Each check prints one JSON line::

    {"check": "gpu-ecc", "status": "fail", "evidence": "GPU 00000000:17:00.0: 2 uncorrectable ECC errors"}

``status`` is ``pass``, ``fail`` or ``skip``; the last line is the verdict::

    {"verdict": "fail", "failed": ["gpu-ecc"]}

Exit 0 on pass, 1 on fail, 2 on wrong arguments. Checks: ``nvidia-smi -q`` (ECC
uncorrectable counts, retired/remapped pages pending or failed, hardware slowdown and
thermal throttle active), NVLink links down (``nvidia-smi nvlink -s``), Xid lines in the
kernel log (``dmesg``, else ``journalctl -k``, or ``--kernel-log FILE``), ``dcgmi diag -r 2``
if DCGM is installed, an NCCL all-reduce (``all_reduce_perf``) if nccl-tests are installed,
local disk (free space, a write) and InfiniBand port state (/sys/class/infiniband, else
``ibstat``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL_TIMEOUT_S = 120.0
_PENDING = ("Pending Page Blacklist", "Pending Page Retirement", "Pending", "Remapping Failure Occurred")
_SLOWDOWN = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown")


def emit(check: str, status: str, evidence: str) -> dict[str, str]:
    row = {"check": check, "status": status, "evidence": evidence[:400]}
    print(json.dumps(row), flush=True)
    return row


def run(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f}s"
    except OSError as exc:
        return 127, str(exc)
    return p.returncode, p.stdout + p.stderr


def check_gpu(rows: list[dict[str, str]]) -> None:
    if shutil.which("nvidia-smi") is None:
        rows.append(emit("gpu", "skip", "nvidia-smi not found"))
        return
    rc, out = run(["nvidia-smi", "-q"])
    if rc != 0:
        rows.append(emit("gpu", "fail", f"nvidia-smi -q exited {rc}: {out.strip()[-200:]}"))
        return
    gpu, section, ecc, pages, throttle = "?", "", [], [], []
    for line in out.splitlines():
        if m := re.match(r"^GPU\s+(\S+)", line):
            gpu = m.group(1)
        stripped = line.strip()
        if stripped and ":" not in stripped:
            section = stripped
        key, _, value = (part.strip() for part in stripped.partition(":"))
        uncorrectable = (re.fullmatch(r"((SRAM|DRAM) )?Uncorrectable", key)
                         or (key, section) == ("Total", "Double Bit"))
        if uncorrectable and value.isdigit() and int(value) > 0:
            ecc.append(f"GPU {gpu}: {value} uncorrectable ECC errors ({section or key})")
        if key in _PENDING and value.lower() == "yes":
            pages.append(f"GPU {gpu}: {key} = Yes")
        if key in _SLOWDOWN and value.lower() == "active":
            throttle.append(f"GPU {gpu}: {key} active")
    rows.append(emit("gpu-ecc", "fail" if ecc else "pass", "; ".join(ecc) or "no uncorrectable ECC errors"))
    rows.append(emit("gpu-pages", "fail" if pages else "pass",
                     "; ".join(pages) or "no retired/remapped pages pending or failed"))
    rows.append(emit("gpu-throttle", "fail" if throttle else "pass",
                     "; ".join(throttle) or "no hardware slowdown active"))
    rc, out = run(["nvidia-smi", "nvlink", "-s"])
    if rc != 0 or not out.strip():
        rows.append(emit("nvlink", "skip", f"nvidia-smi nvlink -s gave nothing (exit {rc})"))
    else:
        down = [ln.strip() for ln in out.splitlines() if re.search(r"inactive|<inactive>", ln, re.I)]
        rows.append(emit("nvlink", "fail" if down else "pass",
                         f"{len(down)} links inactive: {'; '.join(down[:4])}" if down else "all links up"))


def check_xid(rows: list[dict[str, str]], kernel_log: str | None) -> None:
    if kernel_log:
        try:
            with open(kernel_log, encoding="utf-8", errors="replace") as f:
                text, source = f.read(), kernel_log
        except OSError as exc:
            rows.append(emit("xid", "skip", f"cannot read {kernel_log}: {exc}"))
            return
    else:
        text, source = "", ""
        for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
            if shutil.which(argv[0]) is None:
                continue
            rc, out = run(argv)
            if rc == 0:
                text, source = out, argv[0]
                break
        if not source:
            rows.append(emit("xid", "skip", "no readable kernel log (dmesg, journalctl -k)"))
            return
    xids = [ln.strip() for ln in text.splitlines() if "NVRM: Xid" in ln]
    rows.append(emit("xid", "fail" if xids else "pass",
                     f"{len(xids)} Xid lines in {source}, last: {xids[-1]}" if xids else f"no Xid in {source}"))


def check_dcgm(rows: list[dict[str, str]]) -> None:
    if shutil.which("dcgmi") is None:
        rows.append(emit("dcgm", "skip", "dcgmi not found (DCGM not installed)"))
        return
    rc, out = run(["dcgmi", "diag", "-r", "2"], timeout=900.0)
    fails = [ln.strip() for ln in out.splitlines() if re.search(r"\bFail\b", ln)]
    bad = rc != 0 or bool(fails)
    why = f"dcgmi diag -r 2 exited {rc}: " + "; ".join(fails[:4])
    rows.append(emit("dcgm", "fail" if bad else "pass", why if bad else "dcgmi diag -r 2 passed"))


def check_nccl(rows: list[dict[str, str]], min_busbw: float) -> None:
    tool = os.environ.get("B300_NCCL_ALL_REDUCE") or shutil.which("all_reduce_perf")
    if not tool:
        rows.append(emit("nccl", "skip", "all_reduce_perf not found (nccl-tests not installed)"))
        return
    rc, out = run([tool, "-b", "256M", "-e", "256M", "-g", "1"], timeout=600.0)
    m = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", out)
    if rc != 0 or m is None:
        rows.append(emit("nccl", "fail", f"all_reduce_perf exited {rc}: {out.strip()[-200:]}"))
        return
    bw = float(m.group(1))
    slow = bw < min_busbw
    rows.append(emit("nccl", "fail" if slow else "pass",
                     f"all-reduce bus bandwidth {bw:g} GB/s" + (f" < {min_busbw:g} GB/s" if slow else "")))


def check_disk(rows: list[dict[str, str]], paths: list[str], min_free_pct: float) -> None:
    bad, seen = [], []
    for path in paths:
        if not os.path.isdir(path):
            continue
        st = os.statvfs(path)
        free = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        seen.append(f"{path} {free:.0f}% free")
        if free < min_free_pct:
            bad.append(f"{path} {free:.1f}% free < {min_free_pct:g}%")
        try:
            with tempfile.NamedTemporaryFile(dir=path) as f:
                f.write(b"b300 triage")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            bad.append(f"{path} not writable: {exc}")
    rows.append(emit("disk", "fail" if bad else "pass", "; ".join(bad or seen) or "no path to check"))


def check_ib(rows: list[dict[str, str]]) -> None:
    states = {p: Path(p).read_text(encoding="utf-8").strip()
              for p in sorted(glob.glob("/sys/class/infiniband/*/ports/*/state"))}
    if states:
        down = [f"{p.split('/')[4]} port {p.split('/')[6]}: {s}"
                for p, s in states.items() if "ACTIVE" not in s]
        rows.append(emit("ib", "fail" if down else "pass",
                         "; ".join(down) if down else f"{len(states)} ports ACTIVE"))
        return
    if shutil.which("ibstat") is None:
        rows.append(emit("ib", "skip", "no InfiniBand device (/sys/class/infiniband empty, no ibstat)"))
        return
    rc, out = run(["ibstat"])
    found = re.findall(r"State:\s*(\w+)", out)
    down = [s for s in found if s != "Active"]
    bad = bool(rc or down)
    rows.append(emit("ib", "fail" if bad else "pass",
                     f"ibstat exit {rc}, port states {found}" if bad else f"{len(found)} ports Active"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="b300-node-check", description=__doc__.splitlines()[0])
    ap.add_argument("--kernel-log", help="read Xid lines from this file instead of dmesg/journalctl")
    ap.add_argument("--min-busbw", type=float, default=0.0, help="all-reduce bus bandwidth floor, GB/s")
    ap.add_argument("--disk", action="append", default=None, help="a path whose disk to check (repeatable)")
    ap.add_argument("--min-free-pct", type=float, default=5.0)
    args = ap.parse_args(argv)
    rows: list[dict[str, str]] = []
    check_gpu(rows)
    check_xid(rows, args.kernel_log)
    check_dcgm(rows)
    check_nccl(rows, args.min_busbw)
    check_disk(rows, args.disk or ["/", tempfile.gettempdir()], args.min_free_pct)
    check_ib(rows)
    failed = [r["check"] for r in rows if r["status"] == "fail"]
    print(json.dumps({"verdict": "fail" if failed else "pass", "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
