"""Read YAML as kubectl reads it, so ``retool validate`` and the webhook see what the API server will see.

kubectl, the API server, Argo CD and Flux decode YAML with sigs.k8s.io/yaml (v1.6.0), which parses with
go.yaml.in/yaml/v2 (v2.4.3, a YAML 1.1 reader) and converts the result to JSON. PyYAML is YAML 1.1 too,
but the two resolve plain scalars differently; each rule below is taken from the Go source:

- ``y``/``Y``/``n``/``N`` are booleans in go-yaml v2 (``resolveMapList`` in resolve.go); PyYAML reads them
  as strings. An unquoted ``n:`` key therefore reaches the API server as ``"false"``.
- integers are what Go's ``strconv.ParseInt(s, 0, 64)`` accepts once every ``_`` is removed (``0o17``,
  ``0x1F``, ``017``, ``0b101``), then ``ParseUint``; PyYAML's sexagesimal ``1:30`` (90) is a string in Go.
- floats match ``yamlStyleFloat`` (``1e-5`` and ``08`` are floats in Go, strings in PyYAML); a float that
  overflows float64 stays a string.
- timestamps (``2026-01-02``) are strings: go-yaml v2 hands them to ``interface{}`` as strings (decode.go),
  PyYAML makes them dates.
- sigs.k8s.io/yaml turns map keys into strings (``true``/``false`` for booleans, decimal for integers,
  ``FormatFloat(f, 'g', -1, 32)`` for floats) and json.Marshal refuses NaN and infinities; the API server then
  decodes a JSON number without fraction or exponent as an integer, so ``1e3`` arrives as 1000.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import yaml

_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1
_GO_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
}
_GO_NULLS = frozenset(("", "~", "null", "Null", "NULL"))
_GO_SPECIAL_FLOATS = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_YAML_STYLE_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
# Go's ParseInt with base 0: optional sign, then 0x/0o/0b, a leading-0 octal, or decimal.
_DOT_FLOAT = re.compile(r"^\.[0-9]+([eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")

STR, BOOL, INT, FLOAT, NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "bool", "int", "float", "null"))


def _go_int(plain: str) -> int | None:
    match = _GO_INT.match(plain)
    if not match:
        return None
    sign, digits = match.groups()
    lowered = digits.lower()
    if lowered.startswith(("0x", "0o", "0b")):
        value = int(digits, 0)
    elif len(digits) > 1 and digits.startswith("0"):
        value = int(digits, 8)
    else:
        value = int(digits)
    value = -value if sign == "-" else value
    if _INT64[0] <= value <= _INT64[1] or (not sign and 0 <= value <= _UINT64_MAX):
        return value
    return None


def resolve_plain(text: str) -> tuple[str, Any]:
    """The tag and value go-yaml v2's ``resolve`` gives the plain (unquoted) scalar ``text``.

    >>> resolve_plain("n"), resolve_plain("0o17"), resolve_plain("1:30"), resolve_plain("1e3")
    (('tag:yaml.org,2002:bool', False), ('tag:yaml.org,2002:int', 15), ('tag:yaml.org,2002:str', '1:30'), ('tag:yaml.org,2002:float', 1000.0))
    """
    hint = text[:1]
    if text in _GO_NULLS:
        return NULL, None
    if text in _GO_BOOLS:
        return BOOL, _GO_BOOLS[text]
    if text in _GO_SPECIAL_FLOATS:
        return FLOAT, _GO_SPECIAL_FLOATS[text]
    if hint == ".":
        return (FLOAT, float(text)) if _DOT_FLOAT.match(text) else (STR, text)
    if hint and hint in "+-0123456789":  # a timestamp (2026-01-02) falls through: Go hands it over as a string
        plain = text.replace("_", "")
        value = _go_int(plain)
        if value is not None:
            return INT, value
        if _YAML_STYLE_FLOAT.match(plain):
            number = float(plain)
            if not math.isinf(number):  # ParseFloat's range error: go-yaml falls through to a string
                return FLOAT, number
    return STR, text


class KubeYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader resolving plain scalars as go-yaml v2 does (see the module docstring).

    Mapping keys and values come out as sigs.k8s.io/yaml hands them to the API server: see
    :func:`as_api_server_sees`, which :func:`load_documents` applies.
    """

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return resolve_plain(value)[0]
        return super().resolve(kind, value, implicit)


def _construct_resolved(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    tag, value = resolve_plain(node.value)
    if tag != node.tag:  # an explicit tag (``!!int "5"``) the text does not satisfy
        raise yaml.constructor.ConstructorError(None, None, f"cannot decode {node.value!r} as {node.tag}", node.start_mark)
    return value


for _tag in (BOOL, INT, FLOAT, NULL):
    KubeYAMLLoader.add_constructor(_tag, _construct_resolved)


def _go_float_key(number: float) -> str:
    if math.isnan(number):
        return ".nan"
    if math.isinf(number):
        return ".inf" if number > 0 else "-.inf"
    # FormatFloat(f, 'g', -1, 32): the shortest text that reads back as the same float32
    single = _float32(number)
    return next(text for text in (f"{number:.{digits}g}" for digits in range(1, 10)) if _float32(float(text)) == single)


def _float32(number: float) -> float:
    return struct.unpack("f", struct.pack("f", number))[0]


class KubeYAMLError(yaml.YAMLError):
    """A document kubectl cannot send (a NaN or infinite number, a key it cannot turn into a string)."""


def as_api_server_sees(value: Any, path: str = "") -> Any:
    """``value`` (as :class:`KubeYAMLLoader` read it) after sigs.k8s.io/yaml's JSON conversion and the API
    server's JSON decoding: string keys, integral floats below 1e21 as integers (json.Marshal writes them
    without exponent), NaN/infinity refused (json.Marshal fails)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, bool):
                name = "true" if key else "false"
            elif isinstance(key, int):
                name = str(key)
            elif isinstance(key, float):
                name = _go_float_key(key)
            elif isinstance(key, str):
                name = key
            else:
                raise KubeYAMLError(f"{path or '<document>'}: unsupported map key {key!r}: kubectl accepts only scalar keys")
            out[name] = as_api_server_sees(item, f"{path}.{name}" if path else name)
        return out
    if isinstance(value, list):
        return [as_api_server_sees(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise KubeYAMLError(f"{path or '<document>'}: {value} cannot be sent to the API server (JSON has no NaN or infinity)")
        if value.is_integer() and abs(value) < 1e21:
            return int(value)
    return value
