"""The schema registry (Danube's ``danube_schema.SchemaRegistry``, docs/schema-registry.md).

- :mod:`danube.schema.types`: schema types, parsing, canonical forms and fingerprints;
- :mod:`danube.schema.compat`: compatibility checks (Avro, JSON Schema, Protobuf);
- :mod:`danube.schema.registry`: subjects, versions and topic configs in the metadata store;
- :mod:`danube.schema.validation`: topic policies at publish time, payload validators, decoders.
"""
