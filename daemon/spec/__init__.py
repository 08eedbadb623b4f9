"""Training job specs: TOML in, a validated frozen :class:`JobSpec` out.

Records in :mod:`.records` (imported by most of the daemon, so kept free of
pydantic), the grammar in :mod:`.tables`, text in and out in :mod:`.text`.
"""

from .jobspec import (
    CHECKPOINT_SIGNALS,
    LAYOUTS,
    MAX_SCRIPT_BYTES,
    SIGNAL_TARGETS,
    CheckpointPolicy,
    ElasticPolicy,
    HealthPolicy,
    JobSpec,
    RetryPolicy,
)
from .text import dump_spec, elastic_argv, load_spec_file, parse_spec, spec_of

__all__ = ["CHECKPOINT_SIGNALS", "LAYOUTS", "MAX_SCRIPT_BYTES", "SIGNAL_TARGETS", "CheckpointPolicy",
           "ElasticPolicy", "HealthPolicy", "JobSpec", "RetryPolicy", "dump_spec", "elastic_argv",
           "load_spec_file", "parse_spec", "spec_of"]
