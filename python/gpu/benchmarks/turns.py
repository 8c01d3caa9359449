"""Lockstep between processes on one GPU (train_rounds.py --lockstep): each process
of a round takes its turn for every step, so every variant runs step i within a
second of the others, on the host as it is then.

The lent machine's host slows by up to 2x for stretches of seconds to minutes,
which moves a process's steps by 10-40 % against a process run a few minutes
earlier or later (docs/benchmarks.md, sixty-seventh section); two processes that
take turns step by step meet the same stretches, so the same step index of two
variants (the same shapes, the same data) can be set side by side.

The processes form a ring of pipes made by the launcher: a process reads one byte
from the pipe before it (its turn) and writes it to the pipe after it (the next
one's turn). Only the process holding the byte launches work, so the GPU runs one
process's step at a time.

What a process does outside its turn is not in its steps' times: emm's pool
unmaps moved pieces on a helper thread (`EMM_POOL_BACKGROUND_UNMAP`), whose work
after a step may fall in the next process's turn (its CPU time was 0.09-0.30 s
over a whole process in run 368). `lockstep_rounds.sh` runs emm's pool with the
helper off beside it, which keeps that work inside emm's own turns.
"""
import os


class PeerGone(RuntimeError):
    """The process before this one in the ring ended (its pipe reads end of file):
    no turn will come."""


class Turns:
    """One process's place in the ring: `take` waits for its turn, `give` hands the
    turn on. Built from the two inherited descriptors `--turn-fds IN,OUT` names."""

    def __init__(self, read_fd, write_fd):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.taken = 0

    @classmethod
    def parse(cls, text):
        """`IN,OUT` (two descriptor numbers) as `Turns`; None for None."""
        if text is None:
            return None
        try:
            read_fd, write_fd = (int(x) for x in text.split(","))
        except ValueError:
            raise SystemExit(f"--turn-fds takes two descriptor numbers, IN,OUT; found {text!r}") from None
        return cls(read_fd, write_fd)

    def take(self):
        """Waits until the process before this one hands the turn on."""
        got = os.read(self.read_fd, 1)
        if not got:
            raise PeerGone(f"lockstep: the process before this one in the ring ended before turn {self.taken + 1}")
        self.taken += 1

    def give(self):
        """Hands the turn to the next process. A next process that has ended is no
        fault of this one's: its pipe is closed and the byte goes nowhere."""
        try:
            os.write(self.write_fd, b"t")
        except BrokenPipeError:
            pass

    def close(self):
        """Leaves the ring: the next process reads end of file once it has the
        bytes already written."""
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
