"""The daemon's configuration file (TOML), validated into a frozen :class:`Config`.

::

    [daemon]
    state_dir = "/var/lib/b300"          # SQLite database, lock file
    database_url = ""                    # default: sqlite:///<state_dir>/state.db
    database_password_file = ""          # PostgreSQL: the password, never in database_url
    socket = ""                          # default: <state_dir>/b300d.sock
    job_log_dir = ""                     # default: <state_dir>/job-logs; jobs' stdout/stderr
                                         # when a spec sets no output (must be on a filesystem
                                         # the compute nodes share)
    poll_interval = "15s"
    submit_grace = "60s"                 # how long an unconfirmed sbatch may still appear
    max_backoff = "5m"
    log_format = "auto"                  # auto | json | console
    log_level = "info"
    admin_group = ""                     # members may change things through b300ctl
    lease_name = "default"               # HA: daemons on one database with one lease name
    lease_ttl = "15s"

    [slurm]
    backend = "cli"                      # cli | pyslurm | auto (pyslurm only when it is
                                         # built for the controller's Slurm release)
    conf = ""                            # SLURM_CONF for the Slurm tools
    bin_dir = ""                         # where sbatch & co. live (default: PATH)
    command_timeout = "30s"
    accounting_grace = "60s"             # how long a job Slurm calls ended may lack its
                                         # accounting record (slurmdbd slow or down) before
                                         # the controller's view alone is taken

    [recovery]  ...   see RecoveryConfig
    [checkpoints] ... see b300.checkpoints.policy
    [drift] ...       see b300.config.tables.drift
    [report] [metrics] [alerts]  see b300.config.ops

The package: records (:mod:`.records`, :mod:`.ops`), the one duration grammar
(:mod:`b300.grammar.duration`), the shared pydantic types and the one-line error (:mod:`b300.grammar.types`),
the file's tables (:mod:`.tables`, loaded only by :func:`load_config`).
"""

from .load import DEFAULT_CONFIG, config_path, load_config
from .settings import Config, RecoveryConfig, trigger_program, writable_paths

__all__ = ["DEFAULT_CONFIG", "Config", "RecoveryConfig", "config_path", "load_config", "trigger_program",
           "writable_paths"]
