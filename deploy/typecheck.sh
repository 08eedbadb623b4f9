#!/usr/bin/env bash
# mypy (strict) over the package as Python imports it: b300 (daemon/), b300.plugins
# (plugins/) and b300.sql (sql/), so the plugins are checked against the daemon's real
# types rather than against Any. The import names are not the folder names, so the check
# runs on a tree of symbolic links (artifacts/typecheck/b300) built here each time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tree=artifacts/typecheck
rm -rf "$tree"
mkdir -p "$tree/b300"
for f in daemon/*; do ln -s "$PWD/$f" "$tree/b300/"; done
ln -s "$PWD/plugins" "$tree/b300/plugins"
ln -s "$PWD/sql" "$tree/b300/sql"
cd "$tree"
exec "$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" -p b300
