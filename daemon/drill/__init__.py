"""``b300ctl drill``: pull a node out of a running job and measure how long until it is
excluded and the run trains again (issue 14).

Pure: :mod:`.config`, :mod:`.timeline` (the figures from the event log, the refusal
rules). I/O: :mod:`.watch` (the daemon's side: injects the failure, measures, records).
"""
