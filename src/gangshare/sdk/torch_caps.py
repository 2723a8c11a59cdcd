"""The SDK's only contact with PyTorch, and only with a torch the training code imported.

Importing torch ourselves would cost seconds in a job that does not use it (or initialise it
in a job that uses another framework); a job that trains with torch has imported it before
its first step, so `sys.modules` is where to look.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

log = logging.getLogger("gangshare.sdk")

MIB = 1 << 20


def loaded_torch() -> ModuleType | None:
    return sys.modules.get("torch")


def synchronize() -> None:
    """Wait for the GPU's queued work, so a step's end is the GPU's, not the CPU's launch."""
    torch = loaded_torch()
    if torch is None:
        return
    try:
        # Only where CUDA already runs: synchronize() would otherwise initialise it.
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:
        log.debug("torch.cuda.synchronize failed", exc_info=True)


def apply_memory_cap(cap_mib: int | None, previous_mib: int | None) -> bool:
    """Cap every visible device's allocator at `cap_mib` (None lifts the cap).

    False when there is no usable torch with CUDA, so the caller tries again later (the cap
    is then only recorded). Lowering a cap also hands back cached blocks: the allocator's
    cache would otherwise go on holding memory the cap now denies.
    """
    torch = loaded_torch()
    if torch is None:
        return False
    try:
        cuda = torch.cuda
        if not cuda.is_available():
            return False
        for device in range(int(cuda.device_count())):
            if cap_mib is None:
                fraction = 1.0
            else:
                total = int(cuda.get_device_properties(device).total_memory)
                fraction = min(1.0, cap_mib * MIB / total) if total > 0 else 1.0
            cuda.set_per_process_memory_fraction(fraction, device)
        if cap_mib is not None and (previous_mib is None or cap_mib < previous_mib):
            cuda.empty_cache()
    except Exception:
        # Never let a cap stop training, and do not retry a call that failed on every poll;
        # the agent still sees the usage through NVML.
        log.warning("could not apply a GPU memory cap of %s MiB", cap_mib, exc_info=True)
        return True
    return True
