"""High availability: the leader lease and fencing of a stale leader."""
