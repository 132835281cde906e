"""The HTTP/2 frames the client's own transport reads and writes: the vocabulary both sides share
(``danube.h2frames``, where the byte layouts and the header-block encoding are described).

A client's request header blocks use literals only ("literal without indexing, new name", no
Huffman coding), so the client keeps no encoder state.
"""

from __future__ import annotations

from danube.h2frames import *  # noqa: F403 - the shared vocabulary, named here for the client's modules
