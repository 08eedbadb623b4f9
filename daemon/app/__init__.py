"""The b300d process: its parts built once (``root``), its lifetime (``daemon``), the
control socket's requests (``router``, ``requests``), config reloads (``reloader``),
the node-down trigger (``trigger``) and the side jobs (``operations``)."""
