"""Recovery: classify how an attempt ended (``classify``) and act on it (``service``)."""
