"""The daemon-held spare pool (issue 15, the fallback): K healthy idle nodes per partition
kept in a Slurm reservation the daemon owns, used to place a resubmitted run's new job at
once instead of behind the queue. Config: :mod:`.config`; decisions (pure): :mod:`.pool`;
the Slurm side and the record: :mod:`.watch`."""
