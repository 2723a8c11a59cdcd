"""The trace-driven simulator: replays public traces through gangshare.core with virtual time."""
