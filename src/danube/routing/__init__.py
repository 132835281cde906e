"""Routing layer: partitioned topics, live repartition, scalable topics."""
