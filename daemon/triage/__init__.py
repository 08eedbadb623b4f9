"""Node triage (``[triage]``): every node the daemon drained is checked on the node, in a
reservation held for that node alone, then returned or kept out with evidence.

:mod:`.config` is the ``[triage]`` table, :mod:`.decide` the pure decisions (inputs: the
nodes, the triage history, the config, now -> actions), :mod:`.slurm` the one place that
acts on Slurm and records the events, :mod:`.node_check` the default check run on the node.
"""
