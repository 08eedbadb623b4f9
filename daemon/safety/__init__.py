"""What guards the daemon's actions: the daemon mode (observe or act), file permission
checks, and the named crash points of the fault tests."""
