"""The event log's vocabulary, defined once: every kind, the payload keys it carries,
and the groups of kinds that readers ask for together.

A writer builds ``NewEvent(Kind.NODE_DRAINED, data={"reason": ...})``;
:class:`b300.interfaces.NewEvent` refuses a kind that is not a :class:`Kind` and a
payload key the kind does not declare here, so a writer and a reader cannot drift
apart (a typo is an error in the first test that runs the writer, never a silently
unread event). Readers take kinds and groups from here, never spell them.

Payload keys are a superset over the project's history: an event written by an
older version may lack a key; readers use ``data.get``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Kind(enum.StrEnum):
    """Every kind of event the store keeps, grouped by what it is about."""

    # runs and attempts
    RUN_CREATED = "run.created"
    RUN_STATE = "run.state"
    RUN_CANCEL = "run.cancel"
    ATTEMPT_INTENT = "attempt.intent"
    ATTEMPT_SUBMITTED = "attempt.submitted"
    ATTEMPT_SUBMIT_DEFERRED = "attempt.submit_deferred"
    ATTEMPT_SUBMIT_REFUSED = "attempt.submit_refused"
    ATTEMPT_ADOPTED = "attempt.adopted"
    ATTEMPT_ABANDONED = "attempt.abandoned"
    ATTEMPT_DUPLICATE_CANCELLED = "attempt.duplicate_cancelled"
    ATTEMPT_STATE = "attempt.state"
    ATTEMPT_EXCLUDED = "attempt.excluded"
    ATTEMPT_REQUEUED = "attempt.requeued"
    ATTEMPT_CLASSIFIED = "attempt.classified"
    ATTEMPT_HANG = "attempt.hang"
    ATTEMPT_PROGRESS = "attempt.progress"
    ATTEMPT_NODE_LOST = "attempt.node_lost"
    # in-allocation restart (spare_nodes): a new training step in the same Slurm job
    ATTEMPT_STEP_RELAUNCH = "attempt.step_relaunch"
    ATTEMPT_STEP_STARTED = "attempt.step_started"
    EXCLUSIONS_ENDED = "exclusions.ended"
    EXCLUSIONS_TRIMMED = "exclusions.trimmed"
    # PyTorch Elastic runs (b300.elastic): an agent's node lost, an agent started on a spare
    ELASTIC_MEMBER_LEFT = "elastic.member_left"
    ELASTIC_MEMBER_JOINED = "elastic.member_joined"
    # recovery
    # the daemon-held spare pool (b300.spares): its reservation changed; a job placed in it
    SPARES_POOL = "spares.pool"
    SPARES_USED = "spares.used"
    RECOVERY_WAITING = "recovery.waiting"
    RECOVERY_RESUBMIT = "recovery.resubmit"
    RECOVERY_STOPPED = "recovery.stopped"
    RECOVERY_BUDGET_SPENT = "recovery.budget_spent"
    RECOVERY_RESTART_LOOP = "recovery.restart_loop"
    RECOVERY_NO_RESTART = "recovery.no_restart"
    # training health (b300.training): what the job's own progress records show
    TRAINING_LOSS_SPIKE = "training.loss_spike"
    TRAINING_LOSS_NAN = "training.loss_nan"
    TRAINING_THROUGHPUT_DROP = "training.throughput_drop"
    TRAINING_STRAGGLER = "training.straggler"
    TRAINING_CHECKPOINT_STALLED = "training.checkpoint_stalled"
    TRAINING_PROGRESS_PROBLEM = "training.progress_problem"
    TRAINING_EXIT_INTENT = "training.exit_intent"
    TRAINING_FIGURES = "training.figures"
    TRAINING_STRAGGLER_KEPT = "training.straggler_kept"  # straggler_action = "drain" declined
    # nodes
    NODE_STATE = "node.state"
    NODE_FAILED = "node.failed"
    NODE_SUSPECT = "node.suspect"
    NODE_DRAINED = "node.drained"
    NODE_RESUMED = "node.resumed"
    # node triage (b300.triage)
    TRIAGE_STARTED = "triage.started"
    TRIAGE_VERDICT = "triage.verdict"
    TRIAGE_OVERRIDE = "triage.override"
    TRIAGE_REBOOT = "triage.reboot"
    # active failure detection (b300.liveness): not strikes, the daemon's own checks
    LIVENESS_SUSPECT = "liveness.suspect"
    LIVENESS_CLEARED = "liveness.cleared"
    LIVENESS_DEAD = "liveness.dead"
    LIVENESS_RECOVERED = "liveness.recovered"
    # many nodes silent in one round: the network, not the nodes (nothing drained)
    LIVENESS_PARTITION = "liveness.partition"
    LIVENESS_PARTITION_OVER = "liveness.partition_over"
    # failure drills (b300ctl drill): a node pulled out of a running job on purpose, measured
    DRILL_STARTED = "drill.started"
    DRILL_INJECTED = "drill.injected"
    DRILL_FINISHED = "drill.finished"
    # version drift
    DRIFT_FINDING = "drift.finding"
    DRIFT_CLEARED = "drift.cleared"
    DRIFT_DRAINED = "drift.drained"
    DRIFT_ACTION_FAILED = "drift.action_failed"
    # checkpoints
    CHECKPOINT_CORRUPT = "checkpoint.corrupt"
    CHECKPOINT_MARKED = "checkpoint.marked"
    CHECKPOINT_UNMARKED = "checkpoint.unmarked"
    CHECKPOINT_REPLICATED = "checkpoint.replicated"
    CHECKPOINT_REPLICATION_FAILED = "checkpoint.replication_failed"
    CHECKPOINT_REPLICA_PRUNE_STARTED = "checkpoint.replica_prune_started"
    CHECKPOINT_REPLICA_PRUNED = "checkpoint.replica_pruned"
    CHECKPOINT_PRUNE_STARTED = "checkpoint.prune_started"
    CHECKPOINT_PRUNED = "checkpoint.pruned"
    CHECKPOINT_PRUNE_REFUSED = "checkpoint.prune_refused"
    CHECKPOINT_TARGET_UNAVAILABLE = "checkpoint.target_unavailable"
    CHECKPOINT_TARGET_OK = "checkpoint.target_ok"
    CHECKPOINT_OVERDUE = "checkpoint.overdue"
    CHECKPOINT_SIGNAL = "checkpoint.signal"
    CHECKPOINT_OK = "checkpoint.ok"
    # Slurm accounting (sacct/slurmdbd) outages
    ACCOUNTING_UNAVAILABLE = "accounting.unavailable"
    ACCOUNTING_RESTORED = "accounting.restored"
    # operations
    REPORT_SENDING = "report.sending"
    REPORT_SENT = "report.sent"
    REPORT_FAILED = "report.failed"
    ALERT_SENT = "alert.sent"
    ALERTS_CURSOR = "alerts.cursor"
    CONFIG_RELOADED = "config.reloaded"
    CONFIG_REFUSED = "config.refused"
    HA_ACQUIRED = "ha.acquired"
    HA_FAILOVER = "ha.failover"
    # what the daemon would have done, held back by [daemon] mode or [recovery] enabled
    ACTION_WITHHELD = "action.withheld"


_SUBMIT = frozenset({"job_id", "job_name", "exclude"})
_EXCLUSIONS = frozenset({"number", "exclude", "exclusions", "resubmit", "resume_from", "resume",
                         "checkpoints_checked"})
_STRIKE = frozenset({"job_id", "outcome"})
_FINDING = frozenset({"probe", "kind", "expected", "found", "policy"})
_REPLICA = frozenset({"path", "target", "bytes_sent", "error"})
_SCHEDULE = frozenset({"job_id", "number", "message", "age_s", "interval_s", "newest", "newest_step",
                       "counted_from", "signals", "young_daly", "signal", "to", "grace_s",
                       "alerted", "overdue_for_s"})
_LEASE = frozenset({"lease", "epoch", "new", "new_host", "new_pid", "since", "old", "old_host",
                    "old_pid", "old_epoch", "old_renewed_at", "old_expired_at", "old_released"})
_EVIDENCE = frozenset({"outcome", "resubmit", "suspects", "implicated", "reasons", "log", "newest_step"})
_LIVENESS = frozenset({"evidence", "misses"})
_DRILL = frozenset({"drill", "node", "method", "attempt", "job_id", "step_at_failure", "resume_step",
                    "node_state", "node_was_healthy", "timeout_s", "inject_s", "output", "outcome",
                    "error", "detect_s", "detected_by", "drain_s", "excluded_s", "resubmit_s",
                    "allocation_s", "training_s", "trained_step", "new_attempt", "steps_lost", "last_step",
                    "returned"})
_TRAINING = frozenset({"evidence", "host", "value", "threshold", "step"})

#: The payload keys each kind may carry.
PAYLOAD: Mapping[Kind, frozenset[str]] = {
    Kind.RUN_CREATED: frozenset({"name"}),
    Kind.RUN_STATE: frozenset({"from", "to"}),
    Kind.RUN_CANCEL: frozenset({"job_id"}),
    Kind.ATTEMPT_INTENT: _EXCLUSIONS | {"reservation"},
    Kind.ATTEMPT_SUBMITTED: _SUBMIT,
    Kind.ATTEMPT_SUBMIT_DEFERRED: frozenset({"error"}),
    Kind.ATTEMPT_SUBMIT_REFUSED: frozenset({"error"}),
    Kind.ATTEMPT_ADOPTED: frozenset({"job_id", "slurm_state"}),
    Kind.ATTEMPT_ABANDONED: frozenset({"why"}),
    Kind.ATTEMPT_DUPLICATE_CANCELLED: frozenset({"job_id"}),
    Kind.ATTEMPT_STATE: frozenset({"job_id", "from", "to", "slurm_state", "source", "nodes",
                                   "reason", "exit_code", "signal"}),
    Kind.ATTEMPT_EXCLUDED: frozenset({"exclude", "exclusions"}),
    Kind.ATTEMPT_REQUEUED: frozenset({"job_id", "nodes", "suspects"}),
    Kind.ATTEMPT_CLASSIFIED: _EVIDENCE,
    Kind.ATTEMPT_HANG: frozenset({"job_id", "last_step", "stalled_s", "progress_file"}),
    Kind.ATTEMPT_PROGRESS: frozenset({"step", "last", "at"}),
    Kind.ATTEMPT_NODE_LOST: frozenset({"job_id", "nodes", "evidence"}),
    Kind.ATTEMPT_STEP_RELAUNCH: frozenset({"job_id", "generation", "exclude", "outcome", "resume_from",
                                           "suspects", "checkpoints_checked", "spares_left", "cause"}),
    Kind.ATTEMPT_STEP_STARTED: frozenset({"job_id", "generation", "step_id", "nodes", "exclude"}),
    Kind.ELASTIC_MEMBER_LEFT: frozenset({"job_id", "node", "cause", "members", "restarts_used",
                                         "max_restarts", "then"}),
    Kind.ELASTIC_MEMBER_JOINED: frozenset({"job_id", "node", "generation", "replaces", "members",
                                           "spares_left"}),
    Kind.EXCLUSIONS_ENDED: frozenset({"dropped", "kept"}),
    Kind.EXCLUSIONS_TRIMMED: frozenset({"dropped", "kept", "why"}),
    Kind.SPARES_POOL: frozenset({"partition", "reservation", "wanted", "nodes", "idle", "held", "added",
                                 "removed", "short", "error", "adopted", "retired"}),
    Kind.SPARES_USED: frozenset({"partition", "reservation", "needed", "usable", "nodes", "job_id",
                                 "refused", "error", "dropped", "why"}),
    Kind.RECOVERY_WAITING: frozenset({"why", "log"}),
    Kind.RECOVERY_RESUBMIT: frozenset({"outcome", "resume_from", "suspects", "checkpoints_checked"}),
    Kind.RECOVERY_STOPPED: frozenset({"why"}),
    Kind.RECOVERY_BUDGET_SPENT: frozenset({"why"}),
    Kind.RECOVERY_RESTART_LOOP: frozenset({"why", "attempts", "newest_step"}),
    Kind.RECOVERY_NO_RESTART: frozenset({"why", "exit_code"}),
    Kind.TRAINING_LOSS_SPIKE: _TRAINING,
    Kind.TRAINING_LOSS_NAN: _TRAINING,
    Kind.TRAINING_THROUGHPUT_DROP: _TRAINING,
    Kind.TRAINING_STRAGGLER: _TRAINING,
    Kind.TRAINING_CHECKPOINT_STALLED: _TRAINING,
    Kind.TRAINING_PROGRESS_PROBLEM: frozenset({"path", "offset", "problem"}),
    Kind.TRAINING_EXIT_INTENT: frozenset({"restart", "why", "step"}),
    Kind.TRAINING_FIGURES: frozenset({"step", "loss", "tokens_per_s", "samples_per_s", "mfu",
                                      "seconds_per_step", "stragglers"}),
    Kind.TRAINING_STRAGGLER_KEPT: frozenset({"why", "step"}),
    Kind.NODE_STATE: frozenset({"old_state", "old_reason", "state", "reason"}),
    Kind.NODE_FAILED: _STRIKE,
    Kind.NODE_SUSPECT: _STRIKE,
    Kind.NODE_DRAINED: frozenset({"reason", "black_hole", "straggler", "step"}),
    Kind.NODE_RESUMED: frozenset({"by"}),
    Kind.TRIAGE_STARTED: frozenset({"cause", "reason", "reservation", "job_name", "checks", "time_limit_s",
                                    "job_id", "step"}),
    Kind.TRIAGE_VERDICT: frozenset({"verdict", "failed_check", "evidence", "checks", "job_id", "drains",
                                    "resumed", "why", "rebooted", "pool"}),
    Kind.TRIAGE_OVERRIDE: frozenset({"returnable", "triage", "by"}),
    Kind.TRIAGE_REBOOT: frozenset({"failed_check", "evidence", "job_id", "reason"}),
    Kind.LIVENESS_SUSPECT: _LIVENESS,
    Kind.LIVENESS_CLEARED: _LIVENESS,
    Kind.LIVENESS_DEAD: _LIVENESS,
    Kind.LIVENESS_RECOVERED: _LIVENESS,
    Kind.LIVENESS_PARTITION: frozenset({"nodes", "checked", "note"}),
    Kind.LIVENESS_PARTITION_OVER: frozenset({"nodes", "checked", "lasted_s"}),
    Kind.DRILL_STARTED: _DRILL,
    Kind.DRILL_INJECTED: _DRILL,
    Kind.DRILL_FINISHED: _DRILL,
    Kind.DRIFT_FINDING: _FINDING,
    Kind.DRIFT_CLEARED: _FINDING | {"finding_id", "resumed", "reason"},
    Kind.DRIFT_DRAINED: frozenset({"reason"}),
    Kind.DRIFT_ACTION_FAILED: frozenset({"error"}),
    Kind.CHECKPOINT_CORRUPT: frozenset({"path", "problems"}),
    Kind.CHECKPOINT_MARKED: frozenset({"path"}),
    Kind.CHECKPOINT_UNMARKED: frozenset({"path"}),
    Kind.CHECKPOINT_REPLICATED: _REPLICA,
    Kind.CHECKPOINT_REPLICATION_FAILED: _REPLICA,
    Kind.CHECKPOINT_REPLICA_PRUNE_STARTED: frozenset({"target", "replicas"}),
    Kind.CHECKPOINT_REPLICA_PRUNED: frozenset({"target", "paths"}),
    Kind.CHECKPOINT_PRUNE_STARTED: frozenset({"paths"}),
    Kind.CHECKPOINT_PRUNED: frozenset({"paths"}),
    Kind.CHECKPOINT_PRUNE_REFUSED: frozenset({"why"}),
    Kind.CHECKPOINT_TARGET_UNAVAILABLE: frozenset({"target", "error"}),
    Kind.CHECKPOINT_TARGET_OK: frozenset({"target"}),
    Kind.CHECKPOINT_OVERDUE: _SCHEDULE,
    Kind.CHECKPOINT_SIGNAL: _SCHEDULE,
    Kind.CHECKPOINT_OK: _SCHEDULE,
    Kind.ACCOUNTING_UNAVAILABLE: frozenset({"error"}),
    Kind.ACCOUNTING_RESTORED: frozenset({"down_for_s"}),
    Kind.REPORT_SENDING: frozenset({"week", "to"}),
    Kind.REPORT_SENT: frozenset({"week", "to", "message_id"}),
    Kind.REPORT_FAILED: frozenset({"week", "error", "retry"}),
    Kind.ALERT_SENT: frozenset({"kind", "last_id", "summary"}),
    Kind.ALERTS_CURSOR: frozenset({"last_id"}),
    Kind.CONFIG_RELOADED: frozenset({"changed", "needs_restart"}),
    Kind.CONFIG_REFUSED: frozenset({"reason"}),
    Kind.HA_ACQUIRED: _LEASE,
    Kind.HA_FAILOVER: _LEASE,
    Kind.ACTION_WITHHELD: frozenset({"action", "subject", "why", "detail"}),
}

# -- kinds that readers ask for together ------------------------------------------

#: A node was taken out of service by the daemon (a failure, a black hole, drift).
DRAINS = (Kind.NODE_DRAINED, Kind.DRIFT_DRAINED)
#: A node was put back (by an operator or the daemon's drift scan).
RETURNS = (Kind.NODE_RESUMED, Kind.DRIFT_CLEARED)
#: Strikes against a node for the black-hole rule (only infrastructure failures).
STRIKES = (Kind.NODE_FAILED, Kind.NODE_SUSPECT)
#: What restarts a node's strike count: an operator's resume, or Slurm showing it back.
STRIKE_RESETS = (Kind.NODE_RESUMED, Kind.NODE_STATE)
#: A node's history as `b300ctl nodes NODE` shows it.
NODE_HISTORY = (*STRIKES, *DRAINS, Kind.NODE_RESUMED, Kind.DRIFT_CLEARED, Kind.NODE_STATE)
#: What node triage reads back (b300.triage).
TRIAGE = (*DRAINS, Kind.TRIAGE_STARTED, Kind.TRIAGE_REBOOT, Kind.TRIAGE_VERDICT, Kind.TRIAGE_OVERRIDE,
          Kind.NODE_RESUMED)
#: One accounting outage opens and closes with these.
ACCOUNTING = (Kind.ACCOUNTING_UNAVAILABLE, Kind.ACCOUNTING_RESTORED)
#: The checkpoint schedule's own record of an attempt (restored after a restart).
SCHEDULE = (Kind.CHECKPOINT_OVERDUE, Kind.CHECKPOINT_SIGNAL, Kind.CHECKPOINT_OK)
#: Where an attempt's exclusions and their causes are recorded.
EXCLUSIONS = (Kind.ATTEMPT_INTENT, Kind.ATTEMPT_EXCLUDED)
#: What recovery reads of an attempt to classify its end.
END_CAUSES = (Kind.RUN_CANCEL, Kind.ATTEMPT_HANG, Kind.CHECKPOINT_SIGNAL, Kind.ATTEMPT_NODE_LOST)
#: The daemon's own liveness verdicts about a node.
LIVENESS = (Kind.LIVENESS_SUSPECT, Kind.LIVENESS_CLEARED, Kind.LIVENESS_DEAD, Kind.LIVENESS_RECOVERED)
#: One failure drill's record (``data["drill"]``: the id of its drill.started event).
DRILLS = (Kind.DRILL_STARTED, Kind.DRILL_INJECTED, Kind.DRILL_FINISHED)
#: The alert scanner's bookmarks.
ALERT_MARKS = (Kind.ALERT_SENT, Kind.ALERTS_CURSOR)
#: What the training-health detectors found in a running attempt (b300.training.health_step).
TRAINING_FINDINGS = (Kind.TRAINING_LOSS_SPIKE, Kind.TRAINING_LOSS_NAN, Kind.TRAINING_THROUGHPUT_DROP,
                     Kind.TRAINING_STRAGGLER, Kind.TRAINING_CHECKPOINT_STALLED)
#: A run that recovery stopped for a training-health reason (not a spent budget).
TRAINING_STOPS = (Kind.RECOVERY_RESTART_LOOP, Kind.RECOVERY_NO_RESTART)
#: The weekly report's delivery record.
REPORT_DELIVERY = (Kind.REPORT_SENDING, Kind.REPORT_SENT, Kind.REPORT_FAILED)


def check_event(kind: str, data: Mapping[str, object]) -> Kind:
    """``kind`` as a :class:`Kind`; ValueError for an unknown kind or an undeclared key."""
    try:
        known = Kind(kind)
    except ValueError:
        raise ValueError(f"unknown event kind {kind!r} (declare it in b300.events)") from None
    extra = set(data) - PAYLOAD[known]
    if extra:
        raise ValueError(f"event {kind} does not declare payload key(s) {sorted(extra)} "
                         "(b300.events.PAYLOAD)")
    return known
