"""Scalable topics (PIP-468): segment layout DAG, its metadata, the per-topic controller, consumer sessions."""
