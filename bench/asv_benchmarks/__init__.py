"""asv suite of danube: one module per layer (codec.py, wal.py, ...).

Run from ``bench/``: ``asv run --python=same --set-commit-hash=$(git rev-parse HEAD)``.
Speed targets are ``track_*`` ratios against a baseline measured in the same run.
"""
