"""Recovery: how an attempt ended (``classify``, pure), which nodes a run is kept off
(``exclusions``, pure), acting on ended attempts (``recoverer``) and on running ones whose
training stopped advancing (``hangs``)."""
