"""Type stub of danube._core.avrocheck, the compiled Avro payload checker (twin of danube._pure.avrocheck)."""

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

def check_payload(prog: Buffer, payload: Buffer) -> int:
    """-1 when ``payload`` is one whole Avro datum of the program's schema, else the first bad position."""

def check_frames(prog: Buffer, frames: Buffer) -> tuple[int, int]:
    """``(-1, -1)`` when every frame's payload passes, else (bad frame index, position in its payload)."""

def check_attribute(frames: Buffer, name: Buffer, value: Buffer) -> int:
    """-1 when every frame has the attribute ``name`` equal to ``value``, else the first frame's index that has not."""
