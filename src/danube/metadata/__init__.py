"""Metadata: one MetadataStore interface, its implementations, and the key layout."""

from danube.metadata.store import KeyValue, MetadataStore, WatchEvent

__all__ = ["KeyValue", "MetadataStore", "WatchEvent"]
