"""On and off for fastmm's process-wide hooks (`accelerate_numpy`, `accelerate_cupy`).

Each hook is both a call and a context manager: ``fastmm.accelerate_cupy()`` turns it on for good,
``with fastmm.accelerate_cupy():`` for the block. A hook is one state for the whole process, and blocks in several
threads (a thread pool, web requests) overlap and exit in any order, so "restore what the block found" is wrong:
the first block to exit would turn the hook off under the others. Instead the hook stays on while any block is
open or a plain call (not followed by a block of its own) asked for it; ``restore_*()`` turns it off at once.
"""

from __future__ import annotations

import threading
from typing import Callable


class Switch:
    """One hook's state: on or off, open blocks, and the plain calls that asked for it to stay on."""

    def __init__(self, install: Callable[[], None], uninstall: Callable[[], None]):
        self.lock = threading.RLock()
        self._install, self._uninstall = install, uninstall
        self.active = False
        # Calls that asked for the hook for good, less those that a block of their own took back. A count, not a
        # flag: between one thread's call and its block's entry, another thread's plain call must not be lost.
        self._for_good = 0
        self._blocks = 0

    def on(self) -> None:
        """Turn the hook on for good (a block opened by the same call takes that back, see `enter`)."""
        with self.lock:
            if not self.active:
                self._install()
                self.active = True
            self._for_good += 1

    def enter(self) -> None:
        """A block opens: its own call's "for good" becomes "for the block"."""
        with self.lock:
            self._blocks += 1
            self._for_good = max(0, self._for_good - 1)

    def exit(self) -> None:
        with self.lock:
            self._blocks = max(0, self._blocks - 1)
            if self._blocks == 0 and self._for_good == 0:
                self.off()

    def off(self) -> None:
        with self.lock:
            self._for_good = 0
            if self.active:
                self._uninstall()
                self.active = False


class Hook:
    """Base of the public hook classes: the call turns the hook on, ``with`` keeps it on for the block."""

    _switch: Switch
    _name = "hook"

    def __init__(self):
        self._switch.on()

    def __enter__(self):
        self._switch.enter()
        return self

    def __exit__(self, *exc):
        self._switch.exit()
        return False

    def __repr__(self):
        return f"<fastmm {self._name}: {'on' if self._switch.active else 'off'}>"
