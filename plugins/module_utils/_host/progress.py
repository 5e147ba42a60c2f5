# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Progress of a transfer on the host: bytes moved, rate and ETA in a JSON status file.

Private to the collection; the modules that move bytes (model_weights, kernel_cache) write it and their
action plugins (plugins/plugin_utils/progress_action.py) read it while the module runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    JSON = dict[str, Any]
    # callback(done_bytes, total_bytes, file) of a transfer.
    ProgressCallback = Callable[[int, int, str], object]


STATUS_INTERVAL = 2.0


class Progress:
    """Counts bytes moved and reports them: ``callback(done, total, file)`` on every block, and a JSON
    status file (``done_bytes``, ``total_bytes``, ``rate``, ``eta``, ``file``) rewritten atomically at
    most every ``interval`` seconds."""

    def __init__(
        self,
        total: int,
        status_file: str | None = None,
        callback: ProgressCallback | None = None,
        interval: float = STATUS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self.file: str | None = None
        self.status_file = status_file
        self.callback = callback
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.written: float | None = None

    def advance(self, count: int, file: str) -> None:
        self.done += count
        self.file = file
        if self.callback is not None:
            self.callback(self.done, self.total, file)
        now = self.clock()
        if self.status_file and (self.written is None or now - self.written >= self.interval):
            self.write(now)

    def snapshot(self, now: float | None = None, state: str = "running") -> JSON:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        remaining = max(self.total - self.done, 0)
        return {
            "state": state,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "rate": round(rate, 1),
            "eta": round(remaining / rate, 1) if rate > 0 else None,
            "file": self.file,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def write(self, now: float | None = None, state: str = "running") -> None:
        if not self.status_file:
            return
        self.written = self.clock() if now is None else now
        directory, name = os.path.split(os.path.abspath(self.status_file))
        # Progress is advisory: a status file that cannot be written never stops a transfer.
        with contextlib.suppress(OSError, SafeFileError), opened_dir(directory) as dirfd:
            write_json(dirfd, name, self.snapshot(now, state), where=directory)
