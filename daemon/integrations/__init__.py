"""Ready-made progress callbacks for training libraries (progress protocol v1).

- :mod:`b300.integrations.hf`: ``B300ProgressCallback`` for HF transformers ``Trainer``;
- :mod:`b300.integrations.lightning`: ``B300ProgressCallback`` for Lightning.

Each module imports its library only when the callback class is first used, so
importing the module (or this package) costs nothing where the library is absent.
Both write from the global rank 0 only, to the path given or ``$B300_PROGRESS_FILE``.
"""
