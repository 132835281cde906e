"""Private compiled core (Cython). Import the public wrappers instead: danube.message_codec, danube.wal."""
