"""The schema revisions this b300 knows, as constants: a reader (b300ctl) checks the
database against them without importing Alembic (:func:`b300.store.open_store_for_reading`).

Kept in step with ``sql/versions`` by hand: tests/unit/test_schema_revision.py
reads the migration scripts with Alembic and fails, printing the right values,
when a revision is added without updating these.
"""

from __future__ import annotations

#: The head revision(s) of sql/versions: what ``alembic_version`` holds once migrated.
SCHEMA_HEADS = frozenset({"0301"})
#: Every revision in sql/versions (a database at one of them, not at the heads, is older).
SCHEMA_REVISIONS = frozenset({"0001", "0002", "0101", "0201", "0202", "0301", "0321"})
