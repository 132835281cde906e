"""danube: a Danube-compatible message broker with a native (Cython) hot path."""

__version__ = "0.1.0"
