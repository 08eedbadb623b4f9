"""Active failure localisation: find a dead node of a running job in seconds (issue 14).

Pure core: :mod:`.records`, :mod:`.config`, :mod:`.machine`, :mod:`.slurm_addr`
(parsing). I/O edges: the checks :mod:`.icmp` (ICMP echo, the default primary),
:mod:`.syn` (a half-open TCP SYN, the default confirmation), :mod:`.tcp` (a slurmd
connect), :mod:`.confirm` (SSH; imports paramiko, so it is not imported here), driven by
:mod:`.batch`, chosen by :mod:`.probes`; :mod:`.monitor` (one round per interval).
docs/design/liveness.md says why these checks and these defaults.
"""

from ..model import NodeAddress
from .icmp import IcmpProber
from .machine import Health, NodeLiveness, confirmed_dead, observe_checks, observe_confirmations, undecided
from .rounds import Confirmer, LivenessMonitor, PrimaryProber, RoundReport
from .slurm_addr import parse_node_addresses, targets_for
from .syn import SynProber
from .tcp import TcpProber
from .timing import LivenessConfig, load_liveness_config
from .verdicts import (
    CheckOutcome,
    CheckResult,
    ConfirmOutcome,
    ConfirmResult,
    Decision,
    Target,
    Verdict,
)

__all__ = [
    "CheckOutcome", "CheckResult", "ConfirmOutcome", "ConfirmResult", "Confirmer", "Decision", "Health",
    "IcmpProber", "LivenessConfig", "LivenessMonitor", "NodeAddress", "NodeLiveness", "PrimaryProber",
    "RoundReport",
    "SynProber", "Target", "TcpProber", "Verdict", "confirmed_dead", "load_liveness_config", "observe_checks",
    "observe_confirmations", "parse_node_addresses", "targets_for", "undecided",
]
