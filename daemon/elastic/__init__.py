"""PyTorch Elastic runs (issue 33): torchrun agents in one Slurm job, a lost node replaced by
a spare of the same job with no new job. :mod:`.host` runs in the job (its batch script),
:mod:`.members` is the daemon's pure decision for a dead member, :mod:`.effects` carries it
out, and :mod:`.reported` finds the members Slurm itself reports dead, every poll cycle."""
