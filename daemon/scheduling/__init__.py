"""Every timed job of the daemon, listed once (:mod:`.table`)."""
