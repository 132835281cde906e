"""Private compiled core (Cython). Import the public wrappers instead: danube.frames, danube.wal."""
