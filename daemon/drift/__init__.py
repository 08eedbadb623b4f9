"""Version drift: probe nodes over SSH, compare with a baseline, drain what differs.

Pure decisions live in :mod:`.baseline`, SSH in :mod:`.ssh`, the ``[drift]``
config in :mod:`.records` (its grammar: :mod:`b300.config.tables.drift`), the
scan itself in :mod:`.scanner`.
"""
