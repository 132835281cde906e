# C-level contract of danube._core.pbwire: the ack request's fields as a class whose attributes
# the Consume stream reads; nothing else is cimported.  Python API: danube/_core/pbwire.pyi;
# semantics: the pure twin, danube/_pure/pbwire.py.
cdef class AckRequest:
    cdef readonly object consumer_id
    cdef readonly list ranges
    cdef readonly bint checked
