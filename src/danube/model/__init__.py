"""Pure models shared by the client and the broker side: no I/O, no event loop, no server imports.

- `partitions`: which partition a key goes to (FNV-1a-64, as Danube's clients) and partition names;
- `segment_layout`: a scalable topic's versioned DAG of hash-range segments and its key hash;
- `segment_assignment`: which segments each ordered consumer of a scalable topic reads.

They sit below both users (docs/internals.md, tests/unit/test_layering.py): the client routes and
reads with them, `danube.routing` and the server keep them in the metadata store.
"""
