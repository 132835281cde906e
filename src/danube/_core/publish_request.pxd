# C-level contract of danube._core.publish_request: the request's fields as a class whose
# attributes the handler reads; nothing else is cimported.  Python API: publish_request.pyi;
# semantics: the pure twin, danube/_pure/publish_request.py.
cdef class PublishRequest:
    cdef readonly object sequence
    cdef readonly object producer_id
    cdef readonly object create
    cdef readonly object frames
    cdef readonly object partitioning_version
    cdef readonly object schema_id
    cdef readonly object schema_version
