"""The source registry, and policy admission: the check a policy passes before it is used.

Admission (``validate_policy``) is stricter than parsing. The models keep a zero budget or a
zero limit parseable; admission refuses what could never produce an honest brief:

* a source named twice, or a source this process does not know (its options cannot be checked);
* an enabled source under a zero total budget, or with a zero ``token_budget`` of its own
  (a disabled source may hold zero: it reads nothing);
* options that the source's ``options_schema`` does not declare, or of the wrong type. Options
  are validated strictly whatever the schema's own config says: no coercion, no extra keys;
* budgets and limits that are not plain non-negative ints (``True`` and ``"5"`` included), and a
  ``page_order`` that names a kind twice, even on a model built without validation.

No options schema may declare a tenancy field (organization, user, row filter): the subject
travels in the request, and a policy author must never be able to widen it. The registry refuses
such a source at construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from schemas.context import (
    MAX_CONTEXT_ITEM_LIMIT,
    ContextItem,
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
)
from schemas.errors import PolicyError, field_path

TENANCY_OPTION_NAMES = frozenset(
    {
        "organization",
        "organization_id",
        "org_id",
        "tenant",
        "tenant_id",
        "user",
        "user_id",
        "subject",
        "scope_owner_id",
        "filter",
        "filters",
        "row_filter",
        "where",
    }
)


@runtime_checkable
class ContextSource(Protocol):
    """A read-only source of items. ``retrieve`` filters through ``request.subject`` alone."""

    name: str
    options_schema: type[BaseModel]

    async def retrieve(
        self, request: ContextRequest, spec: ContextSourceSpec
    ) -> list[ContextItem]: ...


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


__all__ = ["ContextSource", "ContextSourceRegistry", "PolicyError"]


class ContextSourceRegistry:
    """The sources one process can read, each under a unique name."""

    def __init__(self, sources: Iterable[ContextSource]) -> None:
        self._sources: dict[str, ContextSource] = {}
        for source in sources:
            if source.name in self._sources:
                raise ValueError(f"two sources are named {source.name!r}")
            widening = TENANCY_OPTION_NAMES & set(source.options_schema.model_fields)
            if widening:
                raise ValueError(
                    f"source {source.name!r} declares tenancy options {sorted(widening)}: the "
                    "subject travels in the request, never in a policy"
                )
            self._sources[source.name] = source

    def get(self, name: str) -> ContextSource | None:
        return self._sources.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._sources)

    def validate_policy(self, policy: ContextPolicy) -> None:
        """Admit ``policy`` or raise :class:`PolicyError` for the first problem in field order."""
        if not _is_count(policy.total_token_budget):
            raise PolicyError("total_token_budget", "must be a non-negative integer")
        seen_kinds: set[str] = set()
        for index, kind in enumerate(policy.page_order):
            if kind in seen_kinds:
                raise PolicyError(f"page_order[{index}]", f"names {kind!r} twice")
            seen_kinds.add(kind)
        seen: set[str] = set()
        for index, spec in enumerate(policy.sources):
            path = f"sources[{index}]"
            if spec.name in seen:
                raise PolicyError(f"{path}.name", f"source {spec.name!r} is named twice")
            seen.add(spec.name)
            source = self.get(spec.name)
            if source is None:
                raise PolicyError(f"{path}.name", f"unknown source {spec.name!r}")
            if not _is_count(spec.token_budget):
                raise PolicyError(f"{path}.token_budget", "must be a non-negative integer")
            if spec.limit is not None and not (
                _is_count(spec.limit) and spec.limit <= MAX_CONTEXT_ITEM_LIMIT
            ):
                raise PolicyError(
                    f"{path}.limit", f"must be an integer from 0 to {MAX_CONTEXT_ITEM_LIMIT}"
                )
            _validate_options(source, spec.options, f"{path}.options")
            if spec.enabled and policy.total_token_budget == 0:
                raise PolicyError("total_token_budget", f"is 0 but source {spec.name!r} is enabled")
            if spec.enabled and spec.token_budget == 0:
                raise PolicyError(f"{path}.token_budget", "is 0 for an enabled source")


def _validate_options(source: ContextSource, options: Any, path: str) -> None:
    if not isinstance(options, dict):
        raise PolicyError(path, "must be an object")
    schema = source.options_schema
    declared = set(schema.model_fields) | {
        field.alias for field in schema.model_fields.values() if field.alias
    }
    for key in options:
        if key not in declared:
            raise PolicyError(f"{path}.{key}", f"is not an option of source {source.name!r}")
    try:
        schema.model_validate(options, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        where = field_path(first["loc"])
        raise PolicyError(f"{path}.{where}" if where else path, first["msg"]) from error
