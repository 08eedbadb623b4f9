"""The built-in probes' parsers and commands (pure), and loading probe plugins."""

from __future__ import annotations

import contextlib
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b300.drift.plugins import load_probes
from b300.interfaces import DriftProbe
from b300.plugin_registry import PluginRegistry
from b300.plugins import probes as p
from third_party import Site, site_fixture  # noqa: F401

versions = st.tuples(*[st.integers(0, 999)] * 3).map(lambda t: ".".join(map(str, t)))


@given(versions, st.integers(1, 16))
def test_driver_is_the_one_value_every_gpu_reports(version: str, gpus: int) -> None:
    assert p.DriverProbe().parse(f"{version}\n" * gpus) == version


def test_driver_values_that_differ_inside_a_node_are_all_reported() -> None:
    assert p.DriverProbe().parse("580.65.06\n570.1.2\n") == "570.1.2,580.65.06"


@pytest.mark.parametrize("out", ["", "ERR!\n", "[N/A]\n", "NVIDIA-SMI has failed because it couldn't"])
def test_driver_refuses_what_a_broken_driver_prints(out: str) -> None:
    with pytest.raises(ValueError):
        p.DriverProbe().parse(out)


@given(st.integers(1, 64))
def test_gpu_count_counts_indexes(n: int) -> None:
    assert p.GpuCountProbe().parse("".join(f"{i}\n" for i in range(n))) == str(n)
    with pytest.raises(ValueError):
        p.GpuCountProbe().parse("0\nNo devices were found\n")


def test_vbios_and_cuda_driver() -> None:
    assert p.VbiosProbe().parse("97.00.88.00.0f\n" * 8) == "97.00.88.00.0F"
    smi_q = "==============NVSMI LOG==============\nDriver Version : 580.65.06\nCUDA Version : 13.0\n"
    assert p.CudaDriverProbe().parse(smi_q) == "13.0"
    with pytest.raises(ValueError):
        p.CudaDriverProbe().parse("Driver Version : 580.65.06\n")


def test_cuda_toolkit_from_nvcc() -> None:
    out = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
           "Cuda compilation tools, release 12.9, V12.9.86\nBuild cuda_12.9.r12.9/compiler.35813241_0\n")
    assert p.CudaToolkitProbe().parse(out) == "12.9.86"
    with pytest.raises(ValueError):
        p.CudaToolkitProbe().parse("bash: nvcc: command not found")


@given(versions)
def test_nccl_version_comes_from_the_resolved_library_file(version: str) -> None:
    assert p.NcclProbe().parse(f"/usr/lib/x86_64-linux-gnu/libnccl.so.{version}\n") == version


@pytest.mark.parametrize("out", ["/usr/lib/libnccl.so.2\n", "", "/a/libnccl.so.2.1.1\n/b/libnccl.so.2.1.1\n",
                                 "/usr/lib/libnccl-net.so.2.23.4\n"])
def test_nccl_refuses_anything_but_one_versioned_file(out: str) -> None:
    with pytest.raises(ValueError):
        p.NcclProbe().parse(out)


def test_nccl_and_image_commands_quote_their_settings() -> None:
    assert p.NcclProbe().command({"nccl_library": "/opt/nccl/lib/libnccl.so.2"}) == (
        "readlink -e -- /opt/nccl/lib/libnccl.so.2")
    cmd = p.ImageProbe().command({"image": "/img/a b.sqsh"})
    assert cmd == f"sha256sum -- {shlex.quote('/img/a b.sqsh')}"
    assert p.ImageProbe().command({}) is None
    digest = "a" * 64
    assert p.ImageProbe().parse(f"{digest}  /img/train.sqsh\n") == f"sha256:{digest}"
    with pytest.raises(ValueError):
        p.ImageProbe().parse("sha256sum: /img/train.sqsh: No such file or directory\n")


def test_kernel_ofed_fabricmanager() -> None:
    assert p.KernelProbe().parse("6.1.0-28-amd64\n") == "6.1.0-28-amd64"
    assert p.OfedProbe().parse("MLNX_OFED_LINUX-24.10-1.1.4.0:\n") == "24.10-1.1.4.0"
    assert p.OfedProbe().parse("OFED-internal-25.04-0.6.1:\n") == "25.04-0.6.1"
    assert p.FabricManagerProbe().parse("Fabric Manager version is : 580.65.06\n") == "580.65.06"
    for probe, out in [(p.KernelProbe(), "a\nb\n"), (p.OfedProbe(), "ofed_info: not found"),
                       (p.FabricManagerProbe(), "usage: nv-fabricmanager")]:
        with pytest.raises(ValueError):
            probe.parse(out)


_BUILTINS = [cls() for cls in (p.DriverProbe, p.VbiosProbe, p.GpuCountProbe, p.CudaDriverProbe,
                                p.CudaToolkitProbe, p.NcclProbe, p.ImageProbe, p.KernelProbe, p.OfedProbe,
                                p.FabricManagerProbe)]


@given(st.text(max_size=200))
def test_no_parser_raises_anything_but_value_error(out: str) -> None:
    for probe in _BUILTINS:
        with contextlib.suppress(ValueError):
            probe.parse(out)


def test_every_builtin_is_registered_and_is_a_probe() -> None:
    probes = load_probes()
    assert set(probes) >= {"driver", "cuda_driver", "gpu_count", "vbios", "cuda", "nccl", "image", "kernel",
                           "ofed", "fabricmanager"}
    for name, probe in probes.items():
        assert isinstance(probe, DriftProbe) and probe.name == name


def test_a_broken_probe_is_logged_and_skipped_and_a_wanted_one_missing_says_why(site: Site) -> None:
    from structlog.testing import capture_logs

    site.install("b300-broken-probes", {"b300_tp_probes": "def probe():\n    return 1\n"},
                 {"b300.probes": {"gone": "no_such_module_b300:Probe", "notaprobe": "b300_tp_probes:probe"}})
    with capture_logs() as logs:
        probes = load_probes(["nccl", "gone", "notaprobe", "nope"], PluginRegistry())
    assert list(probes) == ["nccl"]
    skipped = {e["plugin"]: e for e in logs if e["event"] == "plugin.skipped"}
    assert set(skipped) == {"gone", "notaprobe"}
    assert skipped["gone"]["why"].startswith("ModuleNotFoundError: No module named 'no_such_module_b300'")
    assert "does not implement DriftProbe" in skipped["notaprobe"]["why"]
    assert all(e["group"] == "b300.probes" and e["dist"] == "b300-broken-probes" for e in skipped.values())
    missing = {e["probe"]: e["why"] for e in logs if e["event"] == "drift.probe_missing"}
    assert missing["gone"] == skipped["gone"]["why"]
    assert missing["nope"] == "no plugin of that name is installed"
    assert set(missing) == {"gone", "notaprobe", "nope"}
