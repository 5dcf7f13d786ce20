"""Per-rank heartbeat and stall watchdog.

Every rank keeps ``ranks/rank<R>.json`` (host, pid, step, time) fresh, at most once a second, so
the launcher can tell which rank stopped first and where it ran, even when that rank was killed
without a word (SIGKILL, out of memory). A rank that makes no step progress for
``stall_timeout_s`` dumps its Python stacks next to it and exits with code 70: on Slurm
``srun --kill-on-bad-exit=1`` then ends the other ranks, locally the others' collectives fail; the
job ends in bounded time instead of at the wall-time limit.
"""

from __future__ import annotations

import faulthandler
import json
import os
import threading
import time
from pathlib import Path

from contract import records

STALL_EXIT_CODE = 70
WRITE_EVERY_S = 1.0


class Heartbeat:
    def __init__(self, out_dir: Path, rank: int, host: str, stall_timeout_s: float) -> None:
        self.dir = Path(out_dir) / "ranks"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"rank{rank}.json"
        self.rank, self.host, self.stall_timeout_s = rank, host, stall_timeout_s
        self.step: int | None = None
        self.last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write("starting")

    def _write(self, state: str) -> None:
        record = {"rank": self.rank, "host": self.host, "pid": os.getpid(), "step": self.step,
                  "state": state, "time": time.time()}
        # atomic for the launcher's reader; not synced: a beat a second, which a crash makes stale anyway
        records.write_atomic(self.path, json.dumps(record), sync=False)

    def beat(self, step: int) -> None:
        """Called after every step: no I/O here, the watchdog thread writes the file once a second
        (a write and a rename in the training thread took it off the step path at random)."""
        self.step = step
        self.last_beat = time.monotonic()
        if self._thread is None:  # armed at the first step: building and compiling are not stalls
            self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        self._write("running")
        while not self._stop.wait(WRITE_EVERY_S):
            self._write("running")
            stalled_s = time.monotonic() - self.last_beat
            if stalled_s > self.stall_timeout_s:
                with (self.dir / f"stalled-rank{self.rank}.txt").open("w") as f:
                    f.write(f"rank {self.rank} on {self.host} made no progress for {stalled_s:.0f} s after "
                            f"step {self.step}; stacks:\n")
                    f.flush()
                    faulthandler.dump_traceback(file=f, all_threads=True)
                self._write("stalled")
                os._exit(STALL_EXIT_CODE)

    def pause(self) -> None:
        """Checkpointing or the final reduction: long, but not a stall."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._thread = None
        self._stop = threading.Event()

    def close(self, state: str) -> None:
        self.pause()
        self._write(state)
