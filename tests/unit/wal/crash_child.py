"""Child process for test_crash.py: appends with sync='always' and prints every durable offset.

Usage: python crash_child.py <wal dir>.  Runs until killed.
"""

import sys

from danube.wal import Wal


def payload(offset: int) -> bytes:
    return (b"%d|" % offset) * (1 + offset % 7)


def main() -> None:
    out = sys.stdout
    with Wal.open(sys.argv[1], sync="always", max_file_bytes=64 * 1024) as wal:
        out.write("open %d\n" % wal.next_offset)
        out.flush()
        i = 0
        while True:
            nxt = wal.next_offset
            if i % 3 == 0:
                first, last = wal.append_batch([payload(o) for o in range(nxt, nxt + 5)])
            else:
                first = last = wal.append(payload(nxt), key="k%d" % (nxt % 3))
            assert first == nxt
            # append/append_batch returned: durable under sync="always"
            out.write("%d\n" % last)
            out.flush()
            i += 1


if __name__ == "__main__":
    main()
