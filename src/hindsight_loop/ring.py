"""The ring of shared memory the agent's process writes its lines into and the writer reads.

A pipe needed a thread in the agent's process to write to it, and a thread to read the writer's
acknowledgements back: each took the GIL from the agent (every 5 ms switch interval at worst),
lines reached the writer late and ``flush()`` waited for them. Here the agent's own thread copies
each line into memory the writer process has mapped too and moves one counter; nothing in the
agent's process wakes for it.

Layout: a header of 8-byte words, then the data, used as a ring. Positions are byte counts since
the ring was made (they never wrap in a 64-bit word); a position's byte is at ``pos % size``.

- word 0, ``HEAD``: the bytes the agent has written (it moves it after the line's bytes).
- word 8, on the next cache line, the writer's: which of the two ``DURABLE`` pairs is current.
  Each pair is (lines, bytes) made durable; the writer writes the other pair and then flips
  the index, so a writer killed mid-update leaves the current pair whole.
- word 13, ``ASLEEP``: the writer waits for a doorbell (a byte on its stdin) rather than polling.
- words 16-21, a cache line of their own, ``COUNTERS``: what the writers on this ring have
  written, dead-lettered, lost… so far (each writer counts on from what it found there),
  updated as soon as a batch is committed and before what is durable: a flush that finds its
  events durable without asking, and ``stats`` after a writer was restarted, read them all
  the same.

The agent writes into ``[head, durable_bytes + size)`` only: what is not yet durable stays in the
ring, so a writer started after one died reads it again from the durable position. A SIGKILL of
the agent leaves the ring to the writer, which holds it mapped and reads it to ``HEAD``.

x86-64 keeps stores in order, so the writer never sees ``HEAD`` move before the line's bytes;
a weaker machine could, and the writer would dead-letter the line it read torn.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import tempfile

#: The ring's data bytes (faulted in by ``populate`` once the first event comes, and reused once
#: its lines are stored).
SIZE = 8 << 20
#: Linux's ``MADV_POPULATE_WRITE`` (5.14 and later; Python's ``mmap`` does not name it).
_MADV_POPULATE_WRITE = 23
HEADER = 192
HEAD = 0
_INDEX = 8
_PAIRS = (9, 11)
ASLEEP = 13
#: The writers' counters, one word each from ``_COUNTED`` (``Recorder.stats`` has these keys).
COUNTERS = ("written", "batches", "dead_lettered", "spilled", "warnings", "lost")
_COUNTED = 16


class Ring:
    """One mapping of a ring: the agent's (``create``) or the writer's (``Ring(fd, size)``)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, HEADER + size)
        self.words = memoryview(self._map)[:HEADER].cast("Q")
        self.data = memoryview(self._map)[HEADER:]
        # The mapping's address, for ``populate`` (the ctypes view of it goes at once: a buffer
        # still exported would keep ``close`` from unmapping).
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    @classmethod
    def create(cls, size: int = SIZE) -> Ring:
        """A new ring in memory of its own (``memfd``; an unlinked temporary file elsewhere)."""
        try:
            fd = os.memfd_create("hindsight-ring", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, HEADER + size)
        return cls(fd, size)

    def put(self, pos: int, line: bytes) -> None:
        """Copy ``line`` in at ``pos`` (the caller checked there is room)."""
        at = pos % self.size
        end = at + len(line)
        if end <= self.size:
            self.data[at:end] = line
        else:
            cut = self.size - at
            self.data[at:] = line[:cut]
            self.data[: end - self.size] = line[cut:]

    def get(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``pos``, stopping at the ring's end (the next read goes on)."""
        at = pos % self.size
        return bytes(self.data[at : min(at + n, self.size)])

    def durable(self) -> tuple[int, int]:
        """(lines, bytes) the writer has made durable."""
        base = _PAIRS[self.words[_INDEX] & 1]
        return self.words[base], self.words[base + 1]

    def set_durable(self, lines: int, end: int) -> None:
        index = (self.words[_INDEX] & 1) ^ 1
        base = _PAIRS[index]
        self.words[base] = lines
        self.words[base + 1] = end
        self.words[_INDEX] = index

    def counters(self) -> dict[str, int]:
        """The writers' counters as the ring holds them."""
        words = self.words
        return {name: words[_COUNTED + i] for i, name in enumerate(COUNTERS)}

    def set_counters(self, counts: dict[str, int]) -> None:
        words = self.words
        for i, name in enumerate(COUNTERS):
            words[_COUNTED + i] = counts.get(name, 0)

    def populate(self) -> bool:
        """Fault every page of the mapping in now, writable; whether the system did.

        Untouched, each 4 KiB page of the ring faults on the agent's call that first writes into
        it (a page zeroed and mapped, ~2 µs), one call in four for 1 KB lines over the ring's
        first lap, which is all of a short run: a fault every ~4th call was most of the record
        call's p99. Run from a thread other than the agent's: ctypes lets go of the GIL for the
        call, and the kernel maps the 8 MiB (~5-7 ms) while the agent goes on writing (what it
        writes is left as it is). Where the call is missing (before Linux 5.14, another
        system), the pages fault in as lines arrive, as before."""
        if self._map.closed or not sys.platform.startswith("linux"):  # 23 is Linux's number
            return False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            return False
        return madvise(self._address, HEADER + self.size, _MADV_POPULATE_WRITE) == 0

    def close(self) -> None:
        """Let go of the mapping and the descriptor (the memory lives while another holds it)."""
        self.words.release()
        self.data.release()
        self._map.close()
        os.close(self.fd)
