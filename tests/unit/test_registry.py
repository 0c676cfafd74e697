"""Registry construction and policy admission (the publish check)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from contextcore.registry import ContextSource, ContextSourceRegistry, PolicyError
from schemas.context import ContextPolicy, ContextSourceSpec
from tests.unit.fakes import KnowledgeOptions, StaticSource


def knowledge() -> StaticSource:
    source = StaticSource("knowledge")
    source.options_schema = KnowledgeOptions
    return source


REGISTRY = ContextSourceRegistry([StaticSource("application"), knowledge()])


def policy(*specs: dict[str, Any], total: int = 100, **extra: Any) -> ContextPolicy:
    return ContextPolicy.model_validate(
        {"total_token_budget": total, "sources": list(specs), **extra}
    )


def refused(p: ContextPolicy) -> PolicyError:
    with pytest.raises(PolicyError) as raised:
        REGISTRY.validate_policy(p)
    return raised.value


def test_registry_refuses_two_sources_with_one_name() -> None:
    with pytest.raises(ValueError, match="two sources are named 'application'"):
        ContextSourceRegistry([StaticSource("application"), StaticSource("application")])


def test_registry_resolves_by_name_only() -> None:
    assert REGISTRY.get("application") is not None
    assert REGISTRY.get("nope") is None
    assert isinstance(REGISTRY.get("knowledge"), ContextSource)


def test_a_valid_policy_is_admitted() -> None:
    REGISTRY.validate_policy(
        policy(
            {"name": "application", "token_budget": 50, "limit": 10},
            {"name": "knowledge", "token_budget": 50, "options": {"include_platform": True}},
        )
    )


def test_an_undeclared_option_fails_to_publish() -> None:
    error = refused(policy({"name": "knowledge", "token_budget": 5, "options": {"top_k": 3}}))
    assert error.path == "sources[0].options.top_k"


@pytest.mark.parametrize("value", ["true", 1, 0, "yes", None])
def test_an_option_of_the_wrong_type_fails_without_coercion(value: object) -> None:
    error = refused(
        policy({"name": "knowledge", "token_budget": 5, "options": {"include_platform": value}})
    )
    assert error.path == "sources[0].options.include_platform"


def test_options_are_strict_even_when_the_schema_itself_is_lax() -> None:
    class Lax(BaseModel):
        model_config = ConfigDict(extra="allow", strict=False)
        depth: int = 1

    source = StaticSource("lax")
    source.options_schema = Lax
    registry = ContextSourceRegistry([source])
    for options, path in [
        ({"depth": "2"}, "sources[0].options.depth"),
        ({"other": 1}, "sources[0].options.other"),
    ]:
        with pytest.raises(PolicyError) as raised:
            registry.validate_policy(policy({"name": "lax", "token_budget": 5, "options": options}))
        assert raised.value.path == path


def test_a_policy_naming_one_source_twice_fails_to_publish() -> None:
    error = refused(
        policy(
            {"name": "application", "token_budget": 5},
            {"name": "application", "token_budget": 5, "enabled": False},
        )
    )
    assert error.path == "sources[1].name"


def test_a_source_unknown_to_the_process_fails_to_publish() -> None:
    error = refused(policy({"name": "crystal_ball", "token_budget": 5, "enabled": False}))
    assert error.path == "sources[0].name"


@pytest.mark.parametrize("option", ["organization_id", "user_id", "tenant_id", "where"])
def test_a_policy_cannot_widen_the_organization_or_user_scope(option: str) -> None:
    error = refused(
        policy(
            {
                "name": "knowledge",
                "token_budget": 5,
                "options": {option: "00000000-0000-0000-0000-000000000000"},
            }
        )
    )
    assert error.path == f"sources[0].options.{option}"

    class Widening(BaseModel):
        organization_id: str | None = None

    source = StaticSource("wide")
    source.options_schema = Widening
    with pytest.raises(ValueError, match="declares tenancy options"):
        ContextSourceRegistry([source])


def test_an_enabled_source_under_a_zero_total_budget_fails_to_publish() -> None:
    error = refused(policy({"name": "application", "token_budget": 5}, total=0))
    assert error.path == "total_token_budget"


def test_an_enabled_zero_budget_fails_at_its_own_path_and_a_disabled_one_publishes() -> None:
    error = refused(
        policy(
            {"name": "knowledge", "token_budget": 5},
            {"name": "application", "token_budget": 0},
        )
    )
    assert error.path == "sources[1].token_budget"
    REGISTRY.validate_policy(
        policy(
            {"name": "knowledge", "token_budget": 5},
            {"name": "application", "token_budget": 0, "enabled": False},
        )
    )
    REGISTRY.validate_policy(
        policy({"name": "application", "token_budget": 0, "enabled": False}, total=0)
    )


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("token_budget", True, "sources[0].token_budget"),
        ("token_budget", "5", "sources[0].token_budget"),
        ("token_budget", -1, "sources[0].token_budget"),
        ("limit", True, "sources[0].limit"),
        ("limit", 1000, "sources[0].limit"),
    ],
)
def test_budgets_and_limits_smuggled_past_the_model_are_refused(
    field: str, value: object, path: str
) -> None:
    spec = ContextSourceSpec.model_construct(
        name="application", enabled=True, required=False, token_budget=5, limit=None, options={}
    )
    setattr(spec, field, value)
    error = refused(
        ContextPolicy.model_construct(
            sources=[spec], total_token_budget=10, refresh_on_resume=True, page_order=[]
        )
    )
    assert error.path == path


def test_page_order_with_a_kind_twice_never_reaches_the_packer() -> None:
    bad = ContextPolicy.model_construct(
        sources=[],
        total_token_budget=0,
        refresh_on_resume=True,
        page_order=["memory", "knowledge", "memory"],
    )
    assert refused(bad).path == "page_order[2]"
