"""The built-in drift probes (entry-point group ``b300.probes``).

Each probe is a fixed command run on a node over SSH and a pure parser of its
output (see :class:`b300.interfaces.DriftProbe`). Parsers raise ValueError on
output they do not understand; the scan records that as "unparseable". No
value from outside the probe reaches a command except settings the config
has validated against a strict pattern, and those are quoted as well.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

_VERSION = re.compile(r"\d+(?:\.\d+){1,3}")


def _lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if line.strip()]


def _one_line(stdout: str, pattern: re.Pattern[str], error: str) -> re.Match[str]:
    """The output's only non-blank line, matched whole by ``pattern``; ValueError(error) if not."""
    lines = _lines(stdout)
    m = pattern.fullmatch(lines[0]) if len(lines) == 1 else None
    if m is None:
        raise ValueError(error)
    return m


def _one_value(stdout: str, pattern: re.Pattern[str], what: str) -> str:
    """The single value every GPU reports (one line per GPU), checked against ``pattern``."""
    values = _lines(stdout)
    if not values:
        raise ValueError(f"no {what} in the output")
    for value in values:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value[:60]!r} is not a {what}")
    distinct = sorted(set(values))
    if len(distinct) > 1:
        # One node, several values: report them all; the baseline sees a difference.
        return ",".join(distinct)
    return distinct[0]


class DriverProbe:
    """The NVIDIA kernel driver version (``nvidia-smi``), e.g. ``580.65.06``."""

    name = "driver"
    default_policy = "warn"

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nvidia-smi --query-gpu=driver_version --format=csv,noheader"

    def parse(self, stdout: str) -> str:
        return _one_value(stdout, _VERSION, "driver version")


class VbiosProbe:
    """The GPUs' VBIOS version(s), e.g. ``97.00.88.00.0F``; several are joined by commas."""

    name = "vbios"
    default_policy = "warn"
    _RE = re.compile(r"[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f]{2}){3,5}")

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nvidia-smi --query-gpu=vbios_version --format=csv,noheader"

    def parse(self, stdout: str) -> str:
        return _one_value(stdout, self._RE, "VBIOS version").upper()


class GpuCountProbe:
    """How many GPUs the driver sees (a node that lost one is not like the others)."""

    name = "gpu_count"
    default_policy = "warn"

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nvidia-smi --query-gpu=index --format=csv,noheader"

    def parse(self, stdout: str) -> str:
        indexes = _lines(stdout)
        if not indexes or not all(i.isdigit() for i in indexes):
            raise ValueError("not a list of GPU indexes")
        return str(len(indexes))


class CudaDriverProbe:
    """The CUDA version the driver supports (``CUDA Version`` of ``nvidia-smi -q``)."""

    name = "cuda_driver"
    default_policy = "warn"
    _RE = re.compile(r"^\s*CUDA Version\s*:\s*(\d+\.\d+)\s*$", re.MULTILINE)

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nvidia-smi -q"

    def parse(self, stdout: str) -> str:
        found = set(self._RE.findall(stdout))
        if len(found) != 1:
            raise ValueError("no single 'CUDA Version' line")
        return str(found.pop())


class CudaToolkitProbe:
    """The CUDA toolkit (``nvcc --version``), e.g. ``12.9.86``."""

    name = "cuda"
    default_policy = "warn"
    _RE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nvcc --version"

    def parse(self, stdout: str) -> str:
        m = self._RE.search(stdout)
        if m is None:
            raise ValueError("no 'release X.Y, VX.Y.Z' in nvcc's output")
        return m.group(2)


class NcclProbe:
    """The NCCL library file the dynamic linker would load, e.g. ``2.23.4``.

    Resolves ``libnccl.so.2`` (through ``nccl_library`` when configured, else
    ``LD_LIBRARY_PATH``, then the usual system directories) to the real file
    ``libnccl.so.2.X.Y`` and reads the version from its name: what the
    training process maps, not what a package database claims.
    """

    name = "nccl"
    default_policy = "warn"
    _DIRS = "/usr/local/nccl/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib"
    _FILE = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")

    def command(self, settings: Mapping[str, str]) -> str | None:
        lib = settings.get("nccl_library")
        if lib:
            return f"readlink -e -- {shlex.quote(lib)}"
        return (
            'IFS=:; for d in $LD_LIBRARY_PATH; do [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && '
            'exec readlink -e -- "$d/libnccl.so.2"; done; unset IFS; '
            f"for d in {self._DIRS}; do [ -e \"$d/libnccl.so.2\" ] && "
            'exec readlink -e -- "$d/libnccl.so.2"; done; '
            "echo 'libnccl.so.2 not found' >&2; exit 1"
        )

    def parse(self, stdout: str) -> str:
        lines = _lines(stdout)
        if len(lines) != 1:
            raise ValueError("expected one library path")
        m = self._FILE.fullmatch(lines[0].rsplit("/", 1)[-1])
        if m is None:
            raise ValueError(f"{lines[0][:80]!r} is not a libnccl.so.X.Y.Z file")
        return m.group(1)


class ImageProbe:
    """The sha256 of the configured training image file (enroot squashfs or Apptainer SIF)."""

    name = "image"
    default_policy = "warn"
    _RE = re.compile(r"([0-9a-f]{64})\s+\S.*")

    def command(self, settings: Mapping[str, str]) -> str | None:
        image = settings.get("image")
        if not image:
            return None
        return f"sha256sum -- {shlex.quote(image)}"

    def parse(self, stdout: str) -> str:
        return f"sha256:{_one_line(stdout, self._RE, 'not sha256sum output').group(1)}"


class KernelProbe:
    """The running kernel (``uname -r``)."""

    name = "kernel"
    default_policy = "warn"
    _RE = re.compile(r"\d+\.\d+[\w.+~-]*")

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "uname -r"

    def parse(self, stdout: str) -> str:
        return _one_line(stdout, self._RE, "not a kernel release").group(0)


class OfedProbe:
    """The MLNX_OFED / DOCA-OFED release (``ofed_info -s``), e.g. ``24.10-1.1.4.0``."""

    name = "ofed"
    default_policy = "warn"
    _RE = re.compile(r"(?:MLNX_OFED_LINUX|OFED-internal|OFED|DOCA[\w-]*?)-(\d[\w.-]*?):?")

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "ofed_info -s"

    def parse(self, stdout: str) -> str:
        return _one_line(stdout, self._RE, "not an ofed_info -s line").group(1)


class FabricManagerProbe:
    """The NVIDIA Fabric Manager (``nv-fabricmanager --version``), e.g. ``580.65.06``."""

    name = "fabricmanager"
    default_policy = "warn"
    _RE = re.compile(r"fabric manager version(?: is)?\s*:?\s*(\d+(?:\.\d+){1,3})\s*$",
                     re.IGNORECASE | re.MULTILINE)

    def command(self, settings: Mapping[str, str]) -> str | None:
        return "nv-fabricmanager --version"

    def parse(self, stdout: str) -> str:
        m = self._RE.search(stdout)
        if m is None:
            raise ValueError("no 'Fabric Manager version' line")
        return m.group(1)
