"""One plugin loader for the four groups: the built-ins load through their real entry
points; third-party plugins installed as real distributions (a dist-info on sys.path)
work, and broken ones (an import that raises, an object that does not match the group's
protocol, a name that is not its entry point's, two distributions claiming one name) are
logged once and skipped, while asking for them by name is a one-line error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.replicate import load_target
from b300.errors import ConfigError, UsageError
from b300.interfaces import CheckpointLayout, DriftProbe, ReplicationTarget, SlurmClient
from b300.plugin_registry import (
    CHECKPOINT_LAYOUTS,
    DRIFT_PROBES,
    REPLICATION_TARGETS,
    SLURM_BACKENDS,
    PluginRegistry,
)
from b300.slurm import make_slurm_client
from b300.slurm.cli import CliSlurmClient
from third_party import Site, site_fixture  # noqa: F401

BUILTINS = {
    CHECKPOINT_LAYOUTS: {"auto", "dcp", "deepspeed", "generic", "hf", "lightning", "megatron"},
    DRIFT_PROBES: {"cuda", "cuda_driver", "driver", "fabricmanager", "gpu_count", "image", "kernel",
                   "nccl", "ofed", "vbios"},
    REPLICATION_TARGETS: {"filesystem", "s3", "sftp"},
    SLURM_BACKENDS: {"cli", "pyslurm"},
}

def _protocol_methods(protocol: type) -> tuple[str, ...]:
    """Every method a protocol declares: the third-party stand-ins follow the protocol as it grows."""
    return tuple(n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_"))


_TARGET_METHODS = _protocol_methods(ReplicationTarget)
_SLURM_METHODS = _protocol_methods(SlurmClient)


def _methods(names: tuple[str, ...]) -> str:
    return "".join(f"    def {n}(self, *args, **kwargs):\n        raise NotImplementedError\n" for n in names)


GOOD = textwrap.dedent('''\
    import os
    from datetime import UTC, datetime

    from b300.model import CheckpointInfo


    class TidyLayout:
        """Checkpoints are folders tidy-N."""
        name = "tidy"

        def list_checkpoints(self, root):
            try:
                names = os.listdir(root)
            except OSError:
                return []
            found = [CheckpointInfo(os.path.join(root, n), int(n[5:]),
                                    datetime.fromtimestamp(os.stat(os.path.join(root, n)).st_mtime, UTC), True)
                     for n in names if n.startswith("tidy-") and n[5:].isdigit()]
            return sorted(found, key=lambda c: c.step)


    class NotALayout:
        name = "notalayout"


    class ShadowDcp:
        name = "dcp"

        def list_checkpoints(self, root):
            return []


    class MaybeProbe:
        name = "maybe"
        default_policy = "sometimes"

        def command(self, settings):
            return "true"

        def parse(self, stdout):
            return stdout


    class HalfTarget:
        def stat_files(self, replica):
            return {}


    def lying_target(**options):
        return object()


    class Target:
        def __init__(self, *, path, name="tp"):
            self.name, self.path = name, path

    ''') + _methods(_TARGET_METHODS) + textwrap.dedent('''\


    class Backend:
        name = "tp"

        def __init__(self, *, slurm_conf, bin_dir, timeout):
            self.args = (slurm_conf, bin_dir, timeout)

    ''') + _methods(_SLURM_METHODS)


@pytest.fixture
def third_party(site: Site) -> Site:
    broken = "raise RuntimeError('plugin import failed on purpose')\n"
    site.install("b300-tp-plugins", {"b300_tp_good": GOOD, "b300_tp_broken": broken}, {
        "b300.checkpoint_layouts": {"tidy": "b300_tp_good:TidyLayout", "broken": "b300_tp_broken:Layout",
                                    "notalayout": "b300_tp_good:NotALayout", "tidy2": "b300_tp_good:TidyLayout",
                                    "dcp": "b300_tp_good:ShadowDcp"},
        "b300.probes": {"maybe": "b300_tp_good:MaybeProbe"},
        "b300.replication_targets": {"tp": "b300_tp_good:Target", "half": "b300_tp_good:HalfTarget",
                                     "liar": "b300_tp_good:lying_target"},
        "b300.slurm_backends": {"tp": "b300_tp_good:Backend", "broken": "b300_tp_broken:Backend"},
    })
    return site


def test_every_builtin_loads_through_its_entry_point() -> None:
    registry = PluginRegistry()
    protocols = {CHECKPOINT_LAYOUTS: CheckpointLayout, DRIFT_PROBES: DriftProbe}
    with capture_logs() as logs:
        for group, names in BUILTINS.items():
            loaded = registry.load(group)
            assert set(loaded.plugins) == names and dict(loaded.skipped) == {}
            for name, plugin in loaded.plugins.items():
                if group in protocols:
                    assert isinstance(plugin, protocols[group]) and plugin.name == name
                else:
                    assert callable(plugin)
    assert [e for e in logs if e["event"] == "plugin.skipped"] == []
    assert isinstance(registry.get(REPLICATION_TARGETS, "filesystem")(path="/nonexistent"), ReplicationTarget)
    cli = registry.get(SLURM_BACKENDS, "cli")(slurm_conf=None, bin_dir=None, timeout=5)
    assert isinstance(cli, SlurmClient) and isinstance(cli, CliSlurmClient)


def test_a_third_party_layout_works_through_a_real_entry_point(third_party: Site, tmp_path: Path) -> None:
    for step in (3, 1, 2):
        (tmp_path / "ckpt" / f"tidy-{step}").mkdir(parents=True)
    registry = PluginRegistry()
    layout = registry.get(CHECKPOINT_LAYOUTS, "tidy")
    assert [c.step for c in layout.list_checkpoints(str(tmp_path / "ckpt"))] == [1, 2, 3]
    assert registry.get(CHECKPOINT_LAYOUTS, "tidy") is layout  # loaded once, kept
    assert [c.step for c in load_layout("tidy", registry).list_checkpoints(str(tmp_path / "ckpt"))] == [1, 2, 3]


def test_broken_plugins_are_logged_once_and_skipped(third_party: Site) -> None:
    registry = PluginRegistry()
    with capture_logs() as logs:
        layouts = registry.plugins(CHECKPOINT_LAYOUTS)
        registry.plugins(CHECKPOINT_LAYOUTS)
        load_layout("tidy", registry)
    assert set(layouts) == BUILTINS[CHECKPOINT_LAYOUTS] | {"tidy"}
    skipped = [e for e in logs if e["event"] == "plugin.skipped"]
    why = {e["plugin"]: e["why"] for e in skipped}
    assert sorted(e["plugin"] for e in skipped) == ["broken", "dcp", "notalayout", "tidy2"]  # once each
    assert why["broken"] == "RuntimeError: plugin import failed on purpose"
    assert why["notalayout"] == "NotALayout does not implement CheckpointLayout (missing: list_checkpoints)"
    assert why["tidy2"] == "names itself 'tidy', not its entry-point name 'tidy2'"
    assert why["dcp"] == "the built-in plugin b300.plugins.layouts:DcpLayout has that name"
    assert all(e["log_level"] == "warning" and e["group"] == "b300.checkpoint_layouts" for e in skipped)
    assert {e["dist"] for e in skipped} == {"b300-tp-plugins"}
    assert type(layouts["dcp"]).__name__ == "DcpLayout"  # a third party cannot shadow a built-in


def test_asking_for_a_skipped_or_missing_plugin_is_a_one_line_error(third_party: Site) -> None:
    registry = PluginRegistry()
    with pytest.raises(UsageError, match=r"^checkpoint layout 'broken' did not load: RuntimeError: plugin "
                                         r"import failed on purpose$"):
        load_layout("broken", registry)
    with pytest.raises(UsageError, match=r"^unknown checkpoint layout 'nope' \(available: auto, dcp, "
                                         r"deepspeed, generic, hf, lightning, megatron, tidy\)$"):
        load_layout("nope", registry)
    with pytest.raises(ConfigError, match=r"^Slurm backend 'broken' did not load: RuntimeError"):
        make_slurm_client("broken", slurm_conf=None, bin_dir=None, timeout=5, plugins=registry)
    with pytest.raises(ConfigError, match=r"^unknown Slurm backend 'nope' \(available: cli, pyslurm, tp\)$"):
        make_slurm_client("nope", slurm_conf=None, bin_dir=None, timeout=5, plugins=registry)


def test_replication_target_factories_are_checked_at_load_and_at_build(third_party: Site,
                                                                      tmp_path: Path) -> None:
    registry = PluginRegistry()
    with capture_logs() as logs:
        target = load_target("tp", {"path": str(tmp_path), "name": "offsite"}, registry)
    assert isinstance(target, ReplicationTarget) and target.name == "offsite"
    why = {e["plugin"]: e["why"] for e in logs if e["event"] == "plugin.skipped"}
    assert set(why) == {"half"}  # checked at load: a class lacking the protocol's methods
    assert why["half"].startswith("HalfTarget does not implement ReplicationTarget (missing: put_file, ")
    with pytest.raises(UsageError, match=r"^replication target kind 'half' did not load: HalfTarget does not"):
        load_target("half", {}, registry)
    with pytest.raises(UsageError, match=r"^replication target 'tp': .*unexpected keyword argument 'nope'"):
        load_target("tp", {"path": "/x", "nope": 1}, registry)
    # A factory function cannot be checked before it builds: its product is.
    with pytest.raises(UsageError, match=r"^replication target kind 'liar': object does not implement "
                                         r"ReplicationTarget \(missing: name, stat_files, "):
        load_target("liar", {}, registry)


def test_a_third_party_slurm_backend_is_chosen_by_name(third_party: Site) -> None:
    client = make_slurm_client("tp", slurm_conf="/etc/slurm/slurm.conf", bin_dir="/opt/slurm/bin",
                               timeout=7.5, plugins=PluginRegistry())
    assert isinstance(client, SlurmClient) and client.name == "tp"
    assert getattr(client, "args") == ("/etc/slurm/slurm.conf", "/opt/slurm/bin", 7.5)  # noqa: B009


def test_a_probe_breaking_its_groups_own_rule_is_skipped(third_party: Site) -> None:
    with capture_logs() as logs:
        probes = PluginRegistry().plugins(DRIFT_PROBES)
    assert set(probes) == BUILTINS[DRIFT_PROBES]
    [skipped] = [e for e in logs if e["event"] == "plugin.skipped"]
    assert (skipped["plugin"], skipped["why"]) == ("maybe", "default_policy must be 'drain' or 'warn', got "
                                                            "'sometimes'")


def test_two_third_parties_claiming_one_name_get_neither_served(site: Site) -> None:
    layout = 'class L:\n    name = "twice"\n\n    def list_checkpoints(self, root):\n        return []\n'
    for dist in ("one", "two"):
        site.install(f"b300-tp-{dist}", {f"b300_tp_{dist}": layout},
                     {"b300.checkpoint_layouts": {"twice": f"b300_tp_{dist}:L"}})
    registry = PluginRegistry()
    with capture_logs() as logs:
        assert "twice" not in registry.plugins(CHECKPOINT_LAYOUTS)
    assert sorted(e["dist"] for e in logs if e["event"] == "plugin.skipped") == ["b300-tp-one", "b300-tp-two"]
    with pytest.raises(UsageError, match="'twice' did not load: provided by several distributions: "):
        registry.get(CHECKPOINT_LAYOUTS, "twice")


def test_each_registry_loads_for_itself(site: Site) -> None:
    """No module-level cache: a registry keeps what it loaded; a new one sees a plugin installed since."""
    before = PluginRegistry()
    assert "late" not in before.plugins(CHECKPOINT_LAYOUTS)
    site.install("b300-tp-late", {"b300_tp_late": 'class L:\n    name = "late"\n\n'
                                                  '    def list_checkpoints(self, root):\n        return []\n'},
                 {"b300.checkpoint_layouts": {"late": "b300_tp_late:L"}})
    assert "late" not in before.plugins(CHECKPOINT_LAYOUTS)
    assert PluginRegistry().get(CHECKPOINT_LAYOUTS, "late").name == "late"
