"""The poll cycle as one pipeline: one view of the cluster per cycle (``view``), what it
means for each tracked attempt (``observe``, pure), recorded in one transaction
(``track``), then acted on (``pipeline``, with :mod:`b300.recovery`)."""
