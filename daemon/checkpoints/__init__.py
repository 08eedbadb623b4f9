"""Checkpoint lifecycle: find (layouts), verify (manifests), keep or prune (retention),
copy offsite (replication) and watch the schedule.

The pure parts (:mod:`.resume`, :mod:`.retention`, :mod:`.schedule`'s planning) take
plain records; file and network I/O live in :mod:`.walk`, :mod:`.manifest` and the
replication targets.
"""
