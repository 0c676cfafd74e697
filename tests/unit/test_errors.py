"""Every exception class of the packages joins the one root and is drawn in its tree
(schemas/errors.py): read from the source, so no package has to be imported. And the one
mapping from an error to its exit status and its line, for a setting that cannot be read."""

from __future__ import annotations

import ast
import builtins
import json
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

import schemas.errors
from broker.settings import KafkaSettings, TopicSettings
from consumers.build.settings import BuildSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings
from schemas.context import ContextPolicy
from schemas.errors import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    error_lines,
    exit_code,
    run_command,
    setting_error,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = default_model_path(DEFAULT_MODEL)
PACKAGES = ("contextcore", "schemas", "broker", "consumers", "producers", "admin", "devstack")


def _builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


def exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Each exception class defined in the packages: its file and its bases' names."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                    classes[node.name] = (where, bases)
    exceptions: dict[str, tuple[str, list[str]]] = {}
    grew = True
    while grew:  # a class is an exception when a base is one
        grew = False
        for name, (where, bases) in classes.items():
            if name not in exceptions and any(
                _builtin_exception(b) or b in exceptions for b in bases
            ):
                exceptions[name] = (where, bases)
                grew = True
    return exceptions


def test_every_exception_class_derives_from_the_root_and_is_drawn() -> None:
    exceptions = exception_classes()
    assert {"ContextcoreError", "WireError", "PublishError", "ModelMoved"} <= set(exceptions)

    def rooted(name: str) -> bool:
        if name == "ContextcoreError":
            return True
        return any(b in exceptions and rooted(b) for b in exceptions[name][1])

    outside = sorted(
        f"{name} ({where})" for name, (where, _) in exceptions.items() if not rooted(name)
    )
    assert not outside, f"not under ContextcoreError: {outside}"
    tree = schemas.errors.__doc__ or ""
    undrawn = sorted(name for name in exceptions if name not in tree)
    assert not undrawn, f"missing from the tree in schemas/errors.py: {undrawn}"


# A settings group that cannot be read is a setting missing or malformed: exit 2, one line that
# names the variable. A model of anything else that does not validate is invalid input: exit 1.


class _Required(BaseSettings):
    """A group with a required setting (every group of ours has defaults but the URLs, which
    the commands require themselves)."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_REQUIRED_", frozen=True)

    token: str


def _raised(read: Callable[[], object]) -> ValueError:
    with pytest.raises((ValidationError, SettingsError)) as raised:
        read()
    return raised.value


def _reported(error: ValueError) -> tuple[int, list[str]]:
    return exit_code(error), error_lines(error)


@pytest.mark.parametrize(
    ("variable", "value", "group", "line"),
    [
        pytest.param(
            "CONTEXTCORE_KAFKA_REQUEST_TIMEOUT_MS",
            "abc",
            KafkaSettings,
            "CONTEXTCORE_KAFKA_REQUEST_TIMEOUT_MS is malformed: Input should be a valid integer, "
            "unable to parse string as an integer",
            id="kafka-not-a-number",
        ),
        pytest.param(
            "CONTEXTCORE_DATABASE_POOL_SIZE",
            "-1",
            DatabaseSettings,
            "CONTEXTCORE_DATABASE_POOL_SIZE is malformed: Input should be greater than or equal "
            "to 1",
            id="database-below-its-minimum",
        ),
        pytest.param(
            "CONTEXTCORE_BUILD_MAX_IN_FLIGHT",
            "x",
            BuildSettings,
            "CONTEXTCORE_BUILD_MAX_IN_FLIGHT is malformed: Input should be a valid integer, "
            "unable to parse string as an integer",
            id="build-not-a-number",
        ),
        pytest.param(  # JSON that does not parse: pydantic-settings' SettingsError
            "CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS",
            '[{"name": ',
            KnowledgeSettings,
            "CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS is malformed: Expecting value: line 1 column 11 "
            "(char 10)",
            id="knowledge-json-that-does-not-parse",
        ),
        pytest.param(  # JSON that parses, two problems inside it: one line still
            "CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS",
            json.dumps([{"name": "a b", "path": str(MODEL), "pooling": "max"}]),
            KnowledgeSettings,
            "CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS is malformed at 0.name: String should match "
            "pattern '^[A-Za-z0-9._/:-]{1,200}$'; CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS is "
            "malformed at 0.pooling: Extra inputs are not permitted",
            id="knowledge-two-problems-in-its-json",
        ),
        pytest.param(  # a rule between two settings names both
            "CONTEXTCORE_KAFKA_HEARTBEAT_INTERVAL_MS",
            "5000",
            KafkaSettings,
            "CONTEXTCORE_KAFKA_HEARTBEAT_INTERVAL_MS must be at most a third of "
            "CONTEXTCORE_KAFKA_SESSION_TIMEOUT_MS",
            id="kafka-a-rule-between-two",
        ),
        pytest.param(  # aiokafka would have failed at its first connection: exit 1, or 3
            "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS",
            "kafka:notaport",
            KafkaSettings,
            "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS is malformed: 'kafka:notaport': the port must "
            "be a number from 1 to 65535",
            id="kafka-broker-without-a-port",
        ),
        pytest.param(  # asyncpg would have failed when it connects: "cannot reach", exit 3
            "CONTEXTCORE_DATABASE_URL",
            "nonsense",
            DatabaseSettings,
            "CONTEXTCORE_DATABASE_URL is malformed: not a postgresql:// URL",
            id="database-url-not-a-url",
        ),
        pytest.param(  # the upload consumer would have failed at its first document
            "CONTEXTCORE_KNOWLEDGE_CHUNK_OVERLAP",
            "200",
            KnowledgeSettings,
            "CONTEXTCORE_KNOWLEDGE_CHUNK_OVERLAP must be under half of "
            "CONTEXTCORE_KNOWLEDGE_CHUNK_MAX_TOKENS and of every extra model's",
            id="knowledge-overlap-over-half-a-window",
        ),
        pytest.param(  # the tenancy layer used to refuse it at the first scope: exit 1
            "CONTEXTCORE_DATABASE_ROLE",
            "bad role;",
            DatabaseSettings,
            "CONTEXTCORE_DATABASE_ROLE is malformed: 'bad role;' is not a plain role name: 1 to "
            "63 of a-z 0-9 _, not starting with a digit",
            id="database-role-not-a-plain-name",
        ),
        pytest.param(  # the encoder read it as a Hugging Face repository id: a traceback
            "CONTEXTCORE_KNOWLEDGE_MODEL_PATH",
            "/nope",
            KnowledgeSettings,
            "CONTEXTCORE_KNOWLEDGE_MODEL_PATH is malformed: /nope is not a folder",
            id="knowledge-model-path-not-a-folder",
        ),
        pytest.param(  # the client published requests into Kafka's own offsets topic
            "CONTEXTCORE_TOPIC_BUILD_REQUEST",
            "__consumer_offsets",
            TopicSettings,
            "CONTEXTCORE_TOPIC_BUILD_REQUEST is malformed: '__consumer_offsets' is internal to "
            "Kafka (a name starting '__')",
            id="topic-internal-to-kafka",
        ),
        pytest.param(  # a client waited 30 s for a topic the broker refuses: exit 3
            "CONTEXTCORE_TOPIC_MEMORY_WRITE",
            "bad topic!",
            TopicSettings,
            "CONTEXTCORE_TOPIC_MEMORY_WRITE is malformed: 'bad topic!' is not a Kafka topic name "
            "(1 to 249 of A-Z a-z 0-9 . _ -, not '.' or '..')",
            id="topic-not-a-topic-name",
        ),
        pytest.param(  # the consumer joined no group and replayed its topic at each start
            "CONTEXTCORE_MEMORY_GROUP_ID",
            "",
            MemorySettings,
            "CONTEXTCORE_MEMORY_GROUP_ID is malformed: a consumer group id must not be empty: "
            "the consumer would join no group and read its topic again from the start",
            id="consumer-group-id-empty",
        ),
        pytest.param(  # the upload consumer said it was ready, then refused every file://
            "CONTEXTCORE_UPLOAD_FILE_ROOT",
            "relative/dir",
            UploadSettings,
            "CONTEXTCORE_UPLOAD_FILE_ROOT is malformed: relative/dir is not an absolute path",
            id="upload-file-root-relative",
        ),
        pytest.param(  # and every s3:// upload, at its first one
            "CONTEXTCORE_UPLOAD_S3_ENDPOINT_URL",
            "notaurl",
            UploadSettings,
            "CONTEXTCORE_UPLOAD_S3_ENDPOINT_URL is malformed: not an http:// or https:// URL "
            "with a host",
            id="upload-s3-endpoint-not-a-url",
        ),
    ],
)
def test_a_malformed_setting_exits_2_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    group: Callable[[], object],
    line: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert _reported(_raised(group)) == (EXIT_USAGE, [line])


def test_a_missing_setting_exits_2_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTCORE_REQUIRED_TOKEN", raising=False)
    assert _reported(_raised(_Required)) == (EXIT_USAGE, ["CONTEXTCORE_REQUIRED_TOKEN is not set"])
    monkeypatch.setenv("CONTEXTCORE_KNOWLEDGE_MODEL", "another/model")  # the default needs none
    assert _reported(_raised(KnowledgeSettings)) == (
        EXIT_USAGE,
        ["CONTEXTCORE_KNOWLEDGE_MODEL_PATH is not set: where are the files of 'another/model'?"],
    )


def test_a_database_url_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """It holds a password: neither the command's line nor the error's own text shows it."""
    monkeypatch.setenv("CONTEXTCORE_DATABASE_OWNER_URL", "postgresql://o:s3cret@db:5432x/cc")
    error = _raised(DatabaseSettings)
    assert _reported(error) == (
        EXIT_USAGE,
        ["CONTEXTCORE_DATABASE_OWNER_URL is malformed: a port is not a number from 1 to 65535"],
    )
    assert "s3cret" not in str(error)


@pytest.mark.parametrize(
    "servers",
    ["kafka:9092", "a:1,b:2", "a:1, b:2", "kafka", "[::1]:9092", "::1", "", "127.0.0.1:65535"],
)
def test_a_broker_address_aiokafka_reads_is_well_formed(servers: str) -> None:
    assert KafkaSettings(bootstrap_servers=servers).bootstrap_servers == servers


@pytest.mark.parametrize(
    "servers", ["kafka:", "kafka:0", "kafka:99999", "a:1,,b:2", ",", " ", ":9092", "[::1", "a b:1"]
)
def test_a_broker_address_that_is_not_one_is_malformed(servers: str) -> None:
    with pytest.raises(ValidationError, match="bootstrap_servers"):
        KafkaSettings(bootstrap_servers=servers)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@db:5432/cc",
        "postgres://u@db/cc",
        "postgresql://u:p@h1:5432,h2:5433/cc",  # asyncpg's several hosts
        "postgresql://u@[::1]:5432/cc",
        "postgresql:///cc?host=/run/postgresql",
        "",  # not set: require_url says so
    ],
)
def test_a_database_url_asyncpg_reads_is_well_formed(url: str) -> None:
    assert DatabaseSettings(url=url).url == url


@pytest.mark.parametrize(
    "url", ["nonsense", "mysql://u@db/cc", "postgresql://u@db:x/cc", "postgresql://u@a:1,b:0/cc"]
)
def test_a_database_url_that_is_not_one_is_malformed(url: str) -> None:
    with pytest.raises(ValidationError, match="url"):
        DatabaseSettings(url=url)


def test_invalid_input_still_exits_1_line_by_line() -> None:
    """A model that is not a settings group (a policy file, a request, a reply) is input."""
    error = _raised(lambda: ContextPolicy.model_validate({"total_token_budget": "x"}))
    assert _reported(error) == (
        EXIT_REFUSED,
        [
            "invalid input: sources: Field required",
            "invalid input: total_token_budget: Input should be a valid integer",
        ],
    )
    assert setting_error(ValueError("a bad value")) is None


def test_a_command_reports_a_setting_it_was_not_told_to_expect(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run_command`` reports a settings group that cannot be read whatever its ``expected``
    says: a JSON value that does not parse is a ValueError of pydantic-settings' own."""
    monkeypatch.setenv("CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS", "[")

    def serve() -> int:
        KnowledgeSettings()
        return 0

    assert run_command("contextcore serve", serve) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "contextcore serve: CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS is malformed: Expecting value: "
        "line 1 column 2 (char 1)\n"
    )


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (asyncpg.InvalidPasswordError("password authentication failed"), EXIT_USAGE),  # 28P01
        (asyncpg.InvalidAuthorizationSpecificationError("no pg_hba.conf entry"), EXIT_USAGE),
        (asyncpg.InvalidCatalogNameError('database "x" does not exist'), EXIT_USAGE),  # 3D000
        (asyncpg.CannotConnectNowError("the database system is starting up"), EXIT_UNAVAILABLE),
        (asyncpg.TooManyConnectionsError("too many clients"), EXIT_UNAVAILABLE),
        (asyncpg.UndefinedTableError('relation "x" does not exist'), EXIT_REFUSED),
    ],
    ids=["wrong-password", "login-refused", "no-such-database", "starting", "full", "other"],
)
def test_a_database_that_refuses_the_login_for_good_is_a_setting(
    error: BaseException, status: int
) -> None:
    """Retrying with the same URL never passes a wrong password or a database that is not
    there: a setting to correct (2), not "unavailable, may pass if tried again later" (3).
    The pool names the variable (tests/integration/test_commands.py); a driver's error that
    reaches a command unnamed maps by its SQLSTATE alike, and is reported in one line."""
    assert exit_code(error) == status
    if status == EXIT_USAGE:
        assert error_lines(error) == [
            f"the database refuses the login or database of a CONTEXTCORE_DATABASE_ URL: {error}"
        ]

        def index() -> int:
            raise error

        assert run_command("contextcore knowledge", index) == EXIT_USAGE  # not a traceback
