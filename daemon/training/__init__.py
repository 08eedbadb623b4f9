"""Training health: what a job says about its own progress, and what the daemon makes of it.

The job side (standard library only, so a training job can import it without the
daemon's dependencies): :mod:`.protocol` (the progress protocol v1, see
``docs/design/progress.md``) and :mod:`.progress` (``ProgressWriter``); the callbacks for
HF transformers and Lightning are in :mod:`b300.integrations`.

The daemon side, pure except the tailer: :mod:`.reader` (incremental reader and
file tailer), :mod:`.megatron` (Megatron-LM's iteration log line), the detectors
(:mod:`.loss`, :mod:`.throughput`, :mod:`.stragglers`, :mod:`.checkpoint_stall`,
:mod:`.restarts`), :mod:`.mfu`, :mod:`.monitor` (all detectors of one attempt
together) and :mod:`.config` (their thresholds, pydantic).

Nothing is imported here, so ``import b300.training.progress`` stays cheap.
"""
