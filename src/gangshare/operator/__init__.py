"""The kopf operator: gangshare's global scheduler (queues, gang admission, lifecycle)."""
