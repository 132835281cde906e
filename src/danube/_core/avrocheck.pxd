# C-level contract of danube._core.avrocheck: nothing is cimported from it.
# Its Python API (check_payload, check_frames, check_attribute) is in avrocheck.pyi and at the top of
# avrocheck.pyx; the program format is danube/schema/avro_program.py; the pure-Python
# twin is danube/_pure/avrocheck.py.  Frames are walked with frame.pxd's field positions.
