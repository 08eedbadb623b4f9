"""Alembic migrations of the state store (``env.py``, ``versions/``).

This directory is Alembic's ``script_location``; ``b300.store.open_store``
finds it through this package, so it works from any install.
"""
