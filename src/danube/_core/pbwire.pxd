# C-level contract of danube._core.pbwire: nothing is cimported from it yet; its Python API
# (danube/_core/pbwire.pyi) and semantics are those of the pure twin, danube/_pure/pbwire.py.
