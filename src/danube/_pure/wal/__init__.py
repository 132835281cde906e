"""The pure-Python twin of ``danube._core.walfile``, split as the compiled module is
(``_core/wal/``): ``segment`` (SegmentFile) and ``writer`` (LogWriter).
``danube._pure.walfile`` puts them back together under the compiled module's names."""
