"""Alembic revision scripts, applied in order by ``b300.store.open_store``."""
