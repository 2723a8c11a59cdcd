"""The FastAPI scheduler extender called by kube-scheduler (filter, prioritize, bind)."""
