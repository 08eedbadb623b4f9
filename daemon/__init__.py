"""b300-orchestrator: keeps large training runs alive on Slurm GPU clusters."""

__version__ = "0.1.0"
