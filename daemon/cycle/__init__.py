"""The poll cycle as one pipeline: one view of the cluster per cycle (``view``), what it
means for each tracked attempt (``observe``, pure), recorded in one transaction
(``track``), then acted on (``pipeline``, with :mod:`b300.recovery`). The daemon's acts on
Slurm live here too: on nodes (``node_actions``: drain, resume) and on runs (``run_actions``:
submit, resubmit, cancel, each an intent recorded first)."""
