"""The config grammar every feature shares: durations ("5m", "1h30m") and the typed
table base, names and error formatting of the config sections (no feature imports
another's config through here, and this package imports no feature)."""
