"""Kubernetes resource quantities ("16Gi", "500M", 1024) as MiB, with errors naming the field."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX: dict[str, int | Decimal] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
_QUANTITY = re.compile(r"^([+]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


class QuantityError(ValueError):
    pass


def to_bytes(value: str | int | float, field: str) -> Decimal:
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match or match.group(2) not in _SUFFIX:
        raise QuantityError(f"{field}: {text!r} is not a quantity (e.g. 16Gi)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise QuantityError(f"{field}: {text!r} is not a quantity (e.g. 16Gi)") from None
    return number * Decimal(_SUFFIX[match.group(2)])


def to_mib(value: str | int | float, field: str) -> int:
    """Rounded up: asking for part of a MiB still needs that MiB."""
    total = to_bytes(value, field)
    mib = -(-total // (2**20))
    if mib <= 0:
        raise QuantityError(f"{field}: must be positive, got {value!r}")
    return int(mib)


def to_int(value: str | int | float, field: str) -> int:
    return int(to_bytes(value, field))
