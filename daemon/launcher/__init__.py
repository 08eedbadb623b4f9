"""The in-allocation launcher (``python -m b300.launcher``)."""
