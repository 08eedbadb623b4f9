"""Control socket: the server, its client and the status views it serves."""
