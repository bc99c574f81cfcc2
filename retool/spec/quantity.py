"""Kubernetes resource quantities (``"500m"``, ``"64Gi"``, ``8``).

The spec accepts quantities exactly as Kubernetes does so that values can be copied between a
RetoolRun and a Pod spec; parsing them here lets cross-field rules compare sizes (for example a
sandbox replica's memory limit against its concurrent executions) before anything is created.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

# The grammar of k8s.io/apimachinery/pkg/api/resource: a signed decimal number followed by a
# binary suffix, a decimal suffix or a decimal exponent.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the quantity's value in base units (cores, bytes) as a Decimal.

    >>> parse_quantity("64Gi") == 64 * 2**30
    True
    """
    text = str(value).strip()
    if not _QUANTITY_RE.match(text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 500m, 4, 16Gi, 1.5G)")
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * factor
    match = re.match(r"^(.*?)([eE][+-]?[0-9.]+)$", text)
    if match:
        try:
            return Decimal(text)
        except InvalidOperation as err:  # pragma: no cover - the regex already rejected these
            raise ValueError(f"{value!r} is not a Kubernetes quantity") from err
    suffix = text[-1] if text[-1] in _DECIMAL and not text[-1].isdigit() else ""
    number = text[: -len(suffix)] if suffix else text
    return Decimal(number) * _DECIMAL[suffix]


MAX_QUANTITY = Decimal(2**63 - 1)
"""Kubernetes: "no quantity may represent a number greater than 2^63-1" (in base units; CPU is counted in millicores)."""
MAX_QUANTITY_CHARS = 64


def _check_quantity(value: Any) -> str | int:
    # The CRD types a quantity int-or-string, as core Kubernetes does: the API server refuses a
    # fractional number such as 1.5 (write "1.5" or "1500m"), so this does too.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    if isinstance(value, float):
        raise ValueError(f"{value!r} is a fractional number; write a quantity as a string ('{value:g}') or an integer")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a Kubernetes quantity (a string such as '16Gi' or an integer), got {type(value).__name__}")
    if len(str(value)) > MAX_QUANTITY_CHARS:
        raise ValueError(f"a quantity of {len(str(value))} characters is not a Kubernetes quantity")
    amount = parse_quantity(value)
    if amount < 0:
        raise ValueError(f"{value!r} is negative; resource quantities must be >= 0")
    if amount.adjusted() > 18 or amount * 1000 > MAX_QUANTITY:
        raise ValueError(f"{value!r} is larger than Kubernetes can represent (2^63-1 millis); no node offers that much")
    return value


Quantity = Annotated[
    str | int,
    BeforeValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes quantity, typed in the CRD the way core Kubernetes types it (int-or-string)."""
