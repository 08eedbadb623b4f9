"""Active failure localisation: find a dead node of a running job in seconds (issue 14)."""
