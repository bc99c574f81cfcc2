"""The base of every spec object and the string types several spec modules share.

``strict=True`` is what makes ``retool validate`` say what the API server says: the CRD schema
(generated from these models) types ``"2"`` as a string and refuses it for an integer field, so
pydantic must not coerce it either; unknown fields are refused the same way (the API server's
strict field validation, kubectl's default). Nested objects are still given as mappings, as in
YAML.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

K8sName = Annotated[str, StringConstraints(pattern=K8S_NAME_PATTERN, min_length=1, max_length=253)]


class SpecModel(BaseModel):
    """Base of every spec object: camelCase in YAML, unknown fields rejected, no type coercion."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        validate_default=True,
        allow_inf_nan=False,  # inf and NaN are never a learning rate, a coefficient or a timeout
    )
