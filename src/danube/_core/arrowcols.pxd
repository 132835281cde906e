# C-level contract of danube._core.arrowcols: nothing is cimported from it.
# Its Python API (decode_arrow_buffers) is described in arrowcols.pyi and at the
# top of arrowcols.pyx; the pure-Python twin is danube/_pure/arrowcols.py.
