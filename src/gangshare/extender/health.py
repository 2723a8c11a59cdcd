"""The extender's liveness: alive means its watches still hear the API server and its cache
lock is not stuck. A dead watch would leave the cache (and every decision) silently stale."""

from __future__ import annotations

import time

from gangshare.extender.cache import ClusterCache

# A watch asks for bookmarks and is re-opened every 2 minutes, so even an idle cluster is
# heard from far more often than this.
DEFAULT_SILENCE_LIMIT = 300.0
LOCK_WAIT = 2.0


class Health:
    def __init__(self, cache: ClusterCache, silence_limit: float = DEFAULT_SILENCE_LIMIT) -> None:
        self.cache = cache
        self.silence_limit = silence_limit

    def problem(self) -> str | None:
        """None when healthy, else why not (the /healthz body)."""
        if not self.cache.lock.acquire(timeout=LOCK_WAIT):
            return f"cache lock held for over {LOCK_WAIT:.0f}s"
        self.cache.lock.release()
        now = time.monotonic()
        for watch, heard in sorted(self.cache.heard.items()):
            if now - heard > self.silence_limit:
                return f"{watch} watch has heard nothing from the API server for {now - heard:.0f}s"
        return None
