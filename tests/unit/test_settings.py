"""The rules of the settings groups that a value of the right type can still break: each is
refused when the group is read, before the process connects to anything, so every command that
reads the group exits 2 naming the variable (tests/integration/test_commands.py runs them).
Unchecked, each of these failed later: a client waited out its send timeout, a consumer said it
was ready and then failed at its first record, or replayed its topic at every start."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from broker.settings import TopicSettings
from consumers.build.settings import BuildSettings
from consumers.knowledge.upload.settings import UploadSettings
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.settings import ExtraModel, KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings
from producers.command import seconds, whole
from schemas.errors import EXIT_USAGE, ConfigurationError, error_lines, exit_code

SERVICE_TOPICS = ("build_request", "upload", "embed", "memory_write")


def _refused(read: object, **values: object) -> str:
    """The one line a settings group that refuses ``values`` reports, which must exit 2."""
    assert callable(read)
    with pytest.raises((ValidationError, ConfigurationError)) as raised:
        read(**values)
    assert exit_code(raised.value) == EXIT_USAGE
    [line] = error_lines(raised.value)
    return line


# A topic setting names a topic the service reads and dead-letters: a Kafka topic name, never
# one of Kafka's own, never a dead-letter topic, each its own.


@pytest.mark.parametrize("field", SERVICE_TOPICS)
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("bad topic!", "'bad topic!' is not a Kafka topic name"),
        ("", "'' is not a Kafka topic name"),
        (".", "'.' is not a Kafka topic name"),
        ("..", "'..' is not a Kafka topic name"),
        ("t\n", "'t\\n' is not a Kafka topic name"),  # printable, quoted
        ("x" * 250, "'" + "x" * 100 + "' is not a Kafka topic name"),
        ("__consumer_offsets", "'__consumer_offsets' is internal to Kafka"),
        ("__transaction_state", "'__transaction_state' is internal to Kafka"),
        ("contextcore.build-request.dlt", "'contextcore.build-request.dlt' is a dead-letter"),
        ("x" * 246, "'" + "x" * 100 + "'... is too long: its dead-letter topic"),
    ],
    ids=[
        "space-and-bang",
        "empty",
        "dot",
        "dot-dot",
        "newline",
        "longer-than-kafka-takes",
        "consumer-offsets",
        "transaction-state",
        "dead-letter",
        "no-room-for-its-dead-letter-topic",
    ],
)
def test_a_topic_setting_that_cannot_be_a_service_topic_is_malformed(
    monkeypatch: pytest.MonkeyPatch, field: str, name: str, problem: str
) -> None:
    variable = f"CONTEXTCORE_TOPIC_{field.upper()}"
    monkeypatch.setenv(variable, name)
    assert _refused(TopicSettings).startswith(f"{variable} is malformed: {problem}")


@pytest.mark.parametrize("name", ["t", "contextcore.build-request", "A_b-9.x", "x" * 245, "a.dl"])
def test_a_topic_name_kafka_takes_is_accepted(name: str) -> None:
    assert TopicSettings(build_request=name).build_request == name


def test_two_service_topics_may_not_share_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTCORE_TOPIC_EMBED", "contextcore.upload")
    assert _refused(TopicSettings) == (
        "CONTEXTCORE_TOPIC_UPLOAD and CONTEXTCORE_TOPIC_EMBED name one topic, "
        "'contextcore.upload': each of the service's topics must have its own"
    )


@pytest.mark.parametrize("prefix", ["", ".", "..", "bad prefix"])
def test_a_reply_prefix_is_a_topic_name_itself(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    monkeypatch.setenv("CONTEXTCORE_TOPIC_REPLY_PREFIX", prefix)
    assert _refused(TopicSettings).startswith(
        f"CONTEXTCORE_TOPIC_REPLY_PREFIX is malformed: {prefix!r} is not a Kafka topic name"
    )


# A consumer group id: an empty one is no group, so the consumer commits nothing and replays
# its topic from the start at every start.


@pytest.mark.parametrize(
    "group", ["", " contextcore-build", "contextcore-build ", "a\tb", "g" * 256]
)
def test_a_consumer_group_id_that_is_no_group_is_malformed(
    monkeypatch: pytest.MonkeyPatch, group: str
) -> None:
    monkeypatch.setenv("CONTEXTCORE_BUILD_GROUP_ID", group)
    assert _refused(BuildSettings).startswith("CONTEXTCORE_BUILD_GROUP_ID is malformed: a ")


@pytest.mark.parametrize("group", ["contextcore-build", "g", "g" * 255, "team build"])
def test_a_consumer_group_id_is_any_printable_text(group: str) -> None:
    assert BuildSettings(group_id=group).group_id == group


# The upload consumer's file root and S3 endpoint: a wrong one refused every upload, while the
# consumer said it was ready.


def test_a_file_root_must_be_an_absolute_path_to_a_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    variable = "CONTEXTCORE_UPLOAD_FILE_ROOT"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for root, problem in [
        ("/nonexistent-root", "/nonexistent-root is not a folder"),
        ("relative/dir", "relative/dir is not an absolute path"),
        (str(a_file), f"{a_file} is not a folder"),
    ]:
        monkeypatch.setenv(variable, root)
        assert _refused(UploadSettings) == f"{variable} is malformed: {problem}"
    monkeypatch.setenv(variable, str(tmp_path))
    assert UploadSettings().file_root == tmp_path
    monkeypatch.delenv(variable)
    assert UploadSettings().file_root is None  # unset: file:// uploads are refused


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("notaurl", "not an http:// or https:// URL with a host"),
        ("ftp://minio:9000", "not an http:// or https:// URL with a host"),
        ("http://", "not an http:// or https:// URL with a host"),
        ("http://minio:0", "the port is not a number from 1 to 65535"),
        ("http://minio:99999", "the port is not a number from 1 to 65535"),
        ("http://k3y:s3cret@minio:x", "the port is not a number from 1 to 65535"),
        ("http://minio :9000", "a URL holds no whitespace"),
    ],
)
def test_an_s3_endpoint_that_is_not_an_http_url_is_malformed(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    monkeypatch.setenv("CONTEXTCORE_UPLOAD_S3_ENDPOINT_URL", url)
    line = _refused(UploadSettings)
    assert line == f"CONTEXTCORE_UPLOAD_S3_ENDPOINT_URL is malformed: {problem}"
    assert "s3cret" not in line  # the URL may hold a credential: never printed


@pytest.mark.parametrize(
    "url", ["http://minio:9000", "https://s3.eu-west-1.amazonaws.com", "http://[::1]:9000"]
)
def test_an_s3_endpoint_url_is_accepted(url: str) -> None:
    assert UploadSettings(s3_endpoint_url=url).s3_endpoint_url == url


# A model's files: anything but a model's folder failed when the model was first used, the
# encoder reading the path as a Hugging Face repository id (a traceback).


def test_a_model_path_must_be_a_models_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    variable = "CONTEXTCORE_KNOWLEDGE_MODEL_PATH"
    empty, half = tmp_path / "empty", tmp_path / "half"
    empty.mkdir()
    half.mkdir()
    (half / "config.json").write_text("{}")
    for path, problem in [
        ("/nope", "/nope is not a folder"),
        (str(empty), f"{empty} holds no config.json and no tokenizer.json: not a model's folder"),
        (str(half), f"{half} holds no tokenizer.json: not a model's folder"),
    ]:
        monkeypatch.setenv(variable, path)
        assert _refused(KnowledgeSettings) == f"{variable} is malformed: {problem}"
    model = default_model_path(DEFAULT_MODEL)
    monkeypatch.setenv(variable, str(model))
    assert KnowledgeSettings().model_path == model


def test_an_extra_models_path_must_be_a_models_folder() -> None:
    with pytest.raises(ValidationError, match="/nope is not a folder"):
        ExtraModel(name="next", path=Path("/nope"))
    model = default_model_path(DEFAULT_MODEL)
    assert ExtraModel(name="next", path=model).path == model


# The service role's name: the tenancy layer puts it in the statement that enters a scope.


@pytest.mark.parametrize("role", ["bad role;", "", "App", "1app", "a-b", "r" * 64, "app\n"])
def test_a_role_that_is_not_a_plain_name_is_malformed(
    monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    monkeypatch.setenv("CONTEXTCORE_DATABASE_ROLE", role)
    assert _refused(DatabaseSettings) == (
        f"CONTEXTCORE_DATABASE_ROLE is malformed: {role!r} is not a plain role name: 1 to 63 "
        "of a-z 0-9 _, not starting with a digit"
    )


@pytest.mark.parametrize("role", ["contextcore_app", "_x", "r" * 63, "app_2"])
def test_a_plain_role_name_is_accepted(role: str) -> None:
    assert DatabaseSettings(role=role).role == role


# The command line's numbers: out of range is a usage error (argparse's exit 2), not a wait for
# nothing (3) nor a refusal of the service (1).


@pytest.mark.parametrize("text", ["-1", "0", "-0.5", "nan", "inf", "-inf", "x", ""])
def test_seconds_are_finite_and_above_zero(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="a number of seconds above 0"):
        seconds(text)


def test_seconds_take_any_positive_number() -> None:
    assert (seconds("10"), seconds("0.25"), seconds("1e3")) == (10.0, 0.25, 1000.0)


def test_a_whole_number_is_in_its_range() -> None:
    limit = whole(1, 1_000)
    assert (limit("1"), limit("1000")) == (1, 1_000)
    for text in ("-1", "0", "1001", "1.5", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="a whole number from 1 to 1000"):
            limit(text)
    assert whole(0)("123456") == 123_456
    with pytest.raises(argparse.ArgumentTypeError, match="a whole number of 0 or more"):
        whole(0)("-1")
