"""Version drift: probe nodes over SSH, compare with a baseline, drain what differs.

Pure decisions live in :mod:`.baseline`, SSH in :mod:`.ssh`, the ``[drift]``
config in :mod:`.config`, the scan itself in :mod:`.scanner`.
"""
