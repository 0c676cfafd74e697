"""The operator's commands end to end: ``contextcore dev demo`` and ``contextcore build``; and
the exit status of every command ``contextcore --help`` lists when a setting is missing or
malformed (2, before it connects to anything) or its input is invalid (1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from producers import command
from tests.integration.helpers import free_port, run
from tests.services import Config, Database, StartConsumer

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_demo_applies_the_schema_starts_the_consumers_and_prints_the_reply(
    config: Config, empty_database: Database
) -> None:
    settings = config.with_(
        "database",
        url=empty_database.url,
        owner_url=empty_database.owner_url,
        admin_url=empty_database.admin_url,
    ).with_("build", preload_encoder=True)
    code, out, err = await run(
        sys.executable, "-m", "devstack.cli", "demo", env=settings.environ(), timeout=280
    )
    assert code == 0, err
    assert "starting the embedded broker" not in out  # the addresses point elsewhere
    assert "applied 00001_foundation" in out
    reply = json.loads(out[out.index("\n{") + 1 :])
    assert reply["status"] == "ok"
    assert reply["brief"]["failed_sources"] == []
    text = reply["brief"]["text"]
    for heading in (
        "## Conversation",
        "## Application state",
        "## Company dossier",
        "## Agents, workflows and skills",
        "## Run history",
        "## Knowledge",
        "## Personal memory",
        "## Memory",
    ):
        assert heading in text  # every source answered from the seeded demo rows
    assert "lifecycle_stage: customer" in text
    # the dossier's document is the settings' one, and its count says so (issue 36, item 5)
    assert "Document: Pricing guidelines 2027" in text
    assert "The organization's settings list 1 active document(s)." in text
    # the demo asks for the manifest and prints it (explain: true): the kept items first
    table = out[out.index("\nitems: ") + 1 :].splitlines()
    assert table[1].split()[:4] == ["outcome", "source", "class", "tokens"]
    assert table[2].startswith("kept ")
    assert "Acme account handbook (organization): ready, 2 chunk(s)" in out
    assert "CRM basics (platform): ready, 1 chunk(s)" in out
    assert "Tuesday mornings" in text  # the organization's document answers the question
    assert "preference.call_notes: written created" in out
    assert "three bullet points" in text  # the user's own memory
    assert "procurement portal" in text  # a memory about Acme, which resolves in this tenant
    deal = {"kind": "crm.deal", "id": "00000000-0000-4000-8000-0000000000d1", "label": None}
    assert deal in reply["brief"]["items"]


async def test_build_cli_publishes_json_files_and_prints_the_reply(
    config: Config, start_consumer: StartConsumer, tmp_path: Path
) -> None:
    await start_consumer(config)
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "subject": {
                    "organization_id": "6f1c2a3b-0000-4000-8000-000000000001",
                    "user_id": None,
                    "trigger_id": None,
                    "definition_id": None,
                },
                "query": "who is Acme?",
                "entities": [{"kind": "crm.company", "id": "c1"}, {"kind": "broken"}],
            }
        )
    )
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "total_token_budget": 100,
                "sources": [],
            }
        )
    )
    env = config.environ()
    # the installed `contextcore`, the broker named by its global option, not the environment
    cli = str(Path(sys.executable).parent / "contextcore")
    bare = {k: v for k, v in env.items() if k != "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"}
    code, out, err = await run(
        cli, "--bootstrap-servers", config.bootstrap, "build", str(request), str(policy),
        "--timeout", "60", env=bare,
    )  # fmt: skip
    assert code == 0, err
    reply = json.loads(out)
    assert reply["status"] == "ok"
    assert reply["brief"]["items"] == []
    code, out, err = await run(
        cli, "--bootstrap-servers", config.bootstrap, "build", str(request), str(policy),
        "--explain", "--timeout", "60", env=bare,
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("brief: 0 tokens, sha256 e3b0c44298fc1c149afbf4c8996fb924")  # of ""
    assert "items: 0 kept, 0 dropped" in out

    nobody = f"127.0.0.1:{free_port()}"
    code, out, err = await run(
        cli, "--bootstrap-servers", nobody, "build", str(request), str(policy), env=bare
    )
    assert code == 3, err  # unavailable: neither a refusal (1) nor a usage error (2)
    [line] = err.strip().splitlines()
    assert line.startswith(f"contextcore build: cannot reach the Kafka broker at {nobody}")

    policy.write_text(json.dumps({"total_token_budget": "100", "sources": []}))
    code, out, err = await run(
        sys.executable, "-m", "producers.build_cli", str(request), str(policy), env=env
    )
    assert code == 1
    assert err.strip() == (
        "contextcore build: invalid input: policy.total_token_budget: Input should be a valid "
        "integer"
    )


# Every command as `contextcore --help` lists it, run as an operator would, against a broker and
# a database that are not there: a setting missing or malformed must exit 2 with one line that
# names it, before the command connects to anything (connecting first would exit 3 instead);
# invalid input still exits 1; and the same invocation with every setting well-formed gets as
# far as connecting (``reached``), so a 2 is never argparse's own usage error.

CLI = str(Path(sys.executable).parent / "contextcore")
ORG = "7b000000-0000-4000-8000-0000000000a1"
ID = "7b000000-0000-4000-8000-0000000000b1"
BROKER = "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"
URL = "CONTEXTCORE_DATABASE_URL"
OWNER = "CONTEXTCORE_DATABASE_OWNER_URL"
ADMIN = "CONTEXTCORE_DATABASE_ADMIN_URL"

MALFORMED = {
    "kafka": [("CONTEXTCORE_KAFKA_REQUEST_TIMEOUT_MS", "abc")],
    "topic": [
        ("CONTEXTCORE_TOPIC_BUILD_REQUEST_PARTITIONS", "0"),
        ("CONTEXTCORE_TOPIC_BUILD_REQUEST", "__consumer_offsets"),  # a client published into it
        ("CONTEXTCORE_TOPIC_UPLOAD", "bad topic!"),  # a client waited 30 s, then exit 3
        ("CONTEXTCORE_TOPIC_EMBED", ""),
        ("CONTEXTCORE_TOPIC_MEMORY_WRITE", ".."),  # a consumer said it was ready on it
    ],
    "database": [
        ("CONTEXTCORE_DATABASE_POOL_SIZE", "-1"),
        ("CONTEXTCORE_DATABASE_ROLE", "bad role;"),  # refused at the first scope: exit 1
    ],
    "knowledge": [
        ("CONTEXTCORE_KNOWLEDGE_EXTRA_MODELS", '[{"name": '),  # JSON that won't parse
        ("CONTEXTCORE_KNOWLEDGE_MODEL_PATH", "/nope"),  # a traceback at the first encode
    ],
    "build": [
        ("CONTEXTCORE_BUILD_MAX_IN_FLIGHT", "x"),
        ("CONTEXTCORE_BUILD_GROUP_ID", ""),  # no group: it replayed its topic at every start
    ],
    "memory": [
        ("CONTEXTCORE_MEMORY_MAX_IN_FLIGHT", "x"),
        ("CONTEXTCORE_MEMORY_GROUP_ID", ""),
    ],
    "upload": [  # the consumer said it was ready, then refused every file:// or s3:// upload
        ("CONTEXTCORE_UPLOAD_EXTRACT_WORKERS", "0"),
        ("CONTEXTCORE_UPLOAD_FILE_ROOT", "/nonexistent-root"),
        ("CONTEXTCORE_UPLOAD_FILE_ROOT", "relative/dir"),
        ("CONTEXTCORE_UPLOAD_S3_ENDPOINT_URL", "notaurl"),
    ],
    "embed": [("CONTEXTCORE_EMBED_MAX_IN_FLIGHT", "x"), ("CONTEXTCORE_EMBED_GROUP_ID", "")],
    "sweep": [("CONTEXTCORE_SWEEP_BATCH", "0")],
    "dev": [("CONTEXTCORE_DEV_PG_PORT", "x")],
}
"""Malformed values per settings group: each well-typed value after the first breaks a rule
the group checks when it is read (tests/unit/test_settings.py)."""

CONSUMER_GROUPS = {
    "build": ("kafka", "topic", "database", "knowledge", "build"),
    "memory": ("kafka", "topic", "database", "memory"),
    "upload": ("kafka", "topic", "database", "knowledge", "upload"),
    "embed": ("kafka", "topic", "database", "knowledge", "embed"),
    "sweep": ("kafka", "database", "sweep"),
}


@dataclass(frozen=True)
class Invocation:
    argv: tuple[str, ...]
    reads: tuple[str, ...]
    """The settings groups it reads (keys of MALFORMED)."""
    requires: tuple[str, ...]
    """The settings it cannot run without."""
    reached: int = 3
    """Its status with every setting well-formed: 3 when it connects to what is not there."""
    invalid: tuple[str, ...] = ()
    """The same command given input it refuses before it connects (exit 1), if it has any."""


def _knowledge(*argv: str, apply: bool = False) -> Invocation:
    reads: tuple[str, ...] = ("database",)
    requires: tuple[str, ...] = (URL,)
    if apply and argv[0] in ("retry", "switch"):  # they ask the upload consumer over Kafka
        reads, requires = (*reads, "kafka", "topic"), (*requires, BROKER)
        if argv[0] == "switch":  # and prepare registers the model, as the schema owner
            requires = (*requires, OWNER)
    return Invocation(
        ("knowledge", *argv, "--platform", *(["--apply"] if apply else [])), reads, requires
    )


PRINCIPAL = ("--organization", ORG, "--definition", ID, "--user", ID)
REMEMBER = ("memory", "remember", *PRINCIPAL, "--scope", "user", "--attribute", "preference.x")
BUILD_FILES = ("{tmp}/request.json", "{tmp}/policy.json")

INVOCATIONS: dict[str, list[Invocation]] = {
    "build": [
        Invocation(
            ("build", *BUILD_FILES),
            ("kafka", "topic"),
            (BROKER,),
            invalid=("build", "{tmp}/request.json", "{tmp}/invalid-policy.json"),
        )
    ],
    "upload": [
        Invocation(
            ("upload", "{tmp}/guide.md", "--organization", ORG), ("kafka", "topic"), (BROKER,)
        )
    ],
    "memory": [
        Invocation(
            (*REMEMBER, "--text", "short answers"),
            ("kafka", "topic"),
            (BROKER,),
            invalid=(*REMEMBER, "--text", "x", "--ref", "no-colon"),  # a ref without an id
        ),
        Invocation(("memory", "forget", *PRINCIPAL, ID), ("kafka", "topic"), (BROKER,)),
    ],
    "memory.health": [
        Invocation(("memory", "health", "--organization", ORG), ("database",), (URL,))
    ],
    "memory.erase": [
        Invocation(
            ("memory", "erase", "--organization", ORG, "--user", ID), ("database",), (OWNER,)
        )
    ],
    "quota": [Invocation(("quota", "show", "--organization", ORG), ("database",), (OWNER,))],
    "serve": [
        Invocation(("serve", name), groups, (BROKER, URL))
        for name, groups in CONSUMER_GROUPS.items()
    ],
    "policy": [  # reads no setting at all: every group malformed changes nothing
        Invocation(
            ("policy", "check", "{tmp}/policy.json"),
            (),
            (),
            reached=0,
            invalid=("policy", "check", "{tmp}/unknown-source-policy.json"),
        )
    ],
    "schema": [
        Invocation(("schema", "init"), ("database",), (OWNER,)),
        Invocation(("schema", "verify"), ("database",), (OWNER,)),
        Invocation(("schema", "provision"), ("database",), (ADMIN, OWNER, URL)),
    ],
    "knowledge": [
        _knowledge("documents"),
        _knowledge("delete", "--uri", "docs://a"),
        _knowledge("failed"),
        _knowledge("retry", ID),
        _knowledge("retry", ID, apply=True),
        _knowledge("switch", "prepare", "next-model", "--dimensions", "384"),
        _knowledge("switch", "prepare", "next-model", "--dimensions", "384", apply=True),
        _knowledge("switch", "status"),
        _knowledge("switch", "flip"),
        _knowledge("switch", "clean"),
        Invocation(("knowledge", "index"), ("database",), (OWNER,)),
    ],
    "dev": [  # never `dev up`: it would start a stack
        Invocation(("dev", "status"), ("dev",), (), reached=1),  # 1: neither runs here
        Invocation(("dev", "env"), ("dev",), (), reached=0),
        Invocation(("dev", "down"), ("dev",), (), reached=0),
        Invocation(  # the broker named: the demo starts no stack, it provisions first
            ("dev", "demo"),
            (
                "dev",
                "kafka",
                "topic",
                "database",
                "knowledge",
                "build",
                "upload",
                "embed",
                "memory",
            ),
            (ADMIN, OWNER, URL),
        ),
    ],
}
"""Each command's invocations, by its name as an entry point (``memory.health`` is `contextcore
memory health`)."""


def _files(tmp: Path) -> None:
    subject = {"organization_id": ORG, "user_id": None, "trigger_id": None, "definition_id": None}
    request = {"subject": subject, "query": "who is Acme?", "entities": []}
    (tmp / "request.json").write_text(json.dumps(request))
    (tmp / "policy.json").write_text(json.dumps({"total_token_budget": 100, "sources": []}))
    (tmp / "invalid-policy.json").write_text(json.dumps({"total_token_budget": "100"}))
    unknown = {"total_token_budget": 10, "sources": [{"name": "crystal_ball", "token_budget": 5}]}
    (tmp / "unknown-source-policy.json").write_text(json.dumps(unknown))
    (tmp / "guide.md").write_text("# Guide\n\nShort answers.\n")


def _environment(tmp: Path) -> dict[str, str]:
    """Ours without any CONTEXTCORE_* setting, then every address set, to nothing that listens."""
    nobody = free_port()
    database = f"postgresql://nobody:secret@127.0.0.1:{nobody}/nothing"
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
        BROKER: f"127.0.0.1:{nobody}",
        URL: database,
        OWNER: database,
        ADMIN: database,
        "CONTEXTCORE_KAFKA_CONNECT_TIMEOUT_S": "5",
        "CONTEXTCORE_DATABASE_CONNECT_TIMEOUT_S": "5",
        "CONTEXTCORE_DEV_HOME": str(tmp / "dev"),  # never the shared stack's
    }


def _contextcore(argv: tuple[str, ...], env: dict[str, str], tmp: Path) -> tuple[int, str]:
    """The status and the stderr of the installed `contextcore` (killed if it hangs)."""
    args = [arg.format(tmp=tmp) for arg in argv]
    done = subprocess.run(
        [CLI, *args], env=env, capture_output=True, text=True, timeout=90, check=False
    )
    return done.returncode, done.stderr


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    return lines[0] if len(lines) == 1 else f"{len(lines)} lines: {err.strip()[:300]}"


def test_every_command_has_its_invocations() -> None:
    """A new command needs its invocations in INVOCATIONS (its settings, its requirements)."""
    assert set(INVOCATIONS) == set(command.commands())
    assert {group for runs in INVOCATIONS.values() for run in runs for group in run.reads} == set(
        MALFORMED
    )


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    env: dict[str, str]
    status: int
    line: str
    """What its one line on stderr starts with ("": not checked)."""


def _cases(name: str, base: dict[str, str]) -> dict[str, Case]:
    """Every case of one command, by a label that says what it changes."""
    prog = "contextcore " + name.replace(".", " ")
    cases: dict[str, Case] = {}
    for invocation in INVOCATIONS[name]:
        argv, shown = invocation.argv, " ".join(invocation.argv)
        cases[f"{shown} (well-formed)"] = Case(argv, base, invocation.reached, "")
        for group in invocation.reads:
            for variable, value in MALFORMED[group]:
                cases[f"{shown} ({variable}={value!r})"] = Case(
                    argv, {**base, variable: value}, 2, f"{prog}: {variable} is malformed"
                )
        if not invocation.reads:
            every = {**base, **{k: v for group in MALFORMED.values() for k, v in group}}
            cases[f"{shown} (every group malformed)"] = Case(argv, every, invocation.reached, "")
        for variable in invocation.requires:
            unset = {k: v for k, v in base.items() if k != variable}
            cases[f"{shown} (no {variable})"] = Case(
                argv, unset, 2, f"{prog}: {variable} is not set"
            )
        if invocation.invalid:
            cases[" ".join(invocation.invalid)] = Case(invocation.invalid, base, 1, "")
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(command.commands()))
def test_a_setting_missing_or_malformed_exits_2_before_anything_connects(
    name: str, tmp_path: Path
) -> None:
    """Each case's status and the start of its one line, all of a command's at once so that a
    failure lists every case that differs; three processes at a time."""
    assert name in INVOCATIONS, f"contextcore {name}: add its invocations to INVOCATIONS"
    _files(tmp_path)
    cases = _cases(name, _environment(tmp_path))

    def outcome(case: Case) -> tuple[int, str]:
        code, err = _contextcore(case.argv, case.env, tmp_path)
        return code, _one_line(err)

    with ThreadPoolExecutor(max_workers=3) as pool:
        got = dict(zip(cases, pool.map(outcome, cases.values()), strict=True))
    wrong = [
        f"{label}: exit {code} {line!r}, not {case.status} {case.line!r}..."
        for (label, case), (code, line) in zip(cases.items(), got.values(), strict=True)
        if code != case.status or not line.startswith(case.line)
    ]
    assert not wrong, "\n".join([f"{len(wrong)} of {len(cases)} cases:", *wrong])


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (  # the dispatcher's own check: an option without its value
            ("--bootstrap-servers", "", "build", *BUILD_FILES),
            "contextcore: --bootstrap-servers needs a value; see contextcore --help",
        ),
        (
            ("--bootstrap-servers", "kafka:notaport", "build", *BUILD_FILES),
            f"contextcore build: {BROKER} is malformed: 'kafka:notaport': the port must be a "
            "number from 1 to 65535",
        ),
        (
            ("--database-url", "nonsense", "memory", "health", "--organization", ORG),
            f"contextcore memory health: {URL} is malformed: not a postgresql:// URL",
        ),
        (  # never the password, malformed or not
            ("--database-url", "postgresql://u:s3cret@db:x/cc", "serve", "memory"),
            f"contextcore serve: {URL} is malformed: a port is not a number from 1 to 65535",
        ),
    ],
    ids=["bootstrap-servers-empty", "bootstrap-servers-port", "database-url", "no-password"],
)
def test_a_malformed_global_option_exits_2_naming_its_setting(
    argv: tuple[str, ...], line: str, tmp_path: Path
) -> None:
    _files(tmp_path)
    code, err = _contextcore(argv, _environment(tmp_path), tmp_path)
    assert (code, err.strip()) == (2, line)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (  # it waited for nothing, then exited 3 as if the service had not answered
            ("build", *BUILD_FILES, "--timeout", "-1"),
            "contextcore build: error: argument --timeout: must be a number of seconds above 0, "
            "not '-1'",
        ),
        (
            ("upload", "{tmp}/guide.md", "--organization", ORG, "--timeout", "nan"),
            "contextcore upload: error: argument --timeout: must be a number of seconds above 0, "
            "not 'nan'",
        ),
        (  # the admin layer refused it once connected: exit 1
            ("knowledge", "documents", "--platform", "--limit", "-1"),
            "contextcore knowledge documents: error: argument --limit: must be a whole number "
            "from 1 to 1000, not '-1'",
        ),
        (
            ("knowledge", "switch", "prepare", "m", "--dimensions", "0", "--platform"),
            "contextcore knowledge switch prepare: error: argument --dimensions: must be a whole "
            "number from 1 to 16000, not '0'",
        ),
        (
            ("knowledge", "index", "--every", "0"),
            "contextcore knowledge index: error: argument --every: must be a number of seconds "
            "above 0, not '0'",
        ),
        (
            ("memory", "health", "--organization", ORG, "--days", "0"),
            "contextcore memory health: error: argument --days: must be a whole number from 1 to "
            "36500, not '0'",
        ),
    ],
    ids=["build-timeout", "upload-timeout", "documents-limit", "dimensions", "every", "days"],
)
def test_a_number_out_of_range_is_a_usage_error(
    argv: tuple[str, ...], line: str, tmp_path: Path
) -> None:
    """argparse refuses it (its usage, then its one error line: 2) before anything connects."""
    _files(tmp_path)
    code, err = _contextcore(argv, _environment(tmp_path), tmp_path)
    assert (code, err.strip().splitlines()[-1]) == (2, line)


# A setting well-formed that the database refuses for good (a wrong password, a database or a
# role it does not have, a role the login may not become) exits 2 with one line naming the
# variable, never the password: no retry mends it, so never "unavailable" (3), nor a traceback
# (1). Each command that connects, against this test's database and broker.

RUNTIME, OWNED = (URL, True), (OWNER, False)
"""The URL a command connects with, and whether it becomes the service role."""

CONNECTING: dict[str, tuple[tuple[str, ...], tuple[str, bool]]] = {
    "memory health": (("memory", "health", "--organization", ORG), RUNTIME),
    "memory erase": (("memory", "erase", "--organization", ORG, "--user", ID), OWNED),
    "quota show": (("quota", "show", "--organization", ORG), OWNED),
    "knowledge documents": (("knowledge", "documents", "--platform"), RUNTIME),
    "knowledge failed": (("knowledge", "failed", "--platform"), RUNTIME),
    "knowledge index": (("knowledge", "index"), OWNED),
    # the indexer job retried a refused login forever
    "knowledge index --every": (("knowledge", "index", "--apply", "--every", "1"), OWNED),
    "schema verify": (("schema", "verify"), OWNED),
    **{
        f"serve {name}": (("serve", name), RUNTIME)
        for name in ("build", "memory", "upload", "embed", "sweep")
    },
}


def _refusals(argv: tuple[str, ...], url: tuple[str, bool], env: dict[str, str]) -> dict[str, Case]:
    variable, becomes_role = url
    prog = "contextcore " + (" ".join(argv[:2]) if argv[0] == "memory" else argv[0])
    login = urlsplit(env[variable])
    assert login.password is not None
    wrong_password = env[variable].replace(f":{login.password}@", ":not-the-password@")
    no_database = login._replace(path="/no_such_database").geturl()
    shown = login._replace(path="").geturl().replace(f":{login.password}@", ":***@")

    def refused(database: str) -> str:
        return f"{prog}: {variable} is refused by the database at {shown}/{database}: "

    cases = {
        "wrong password": Case(
            argv,
            {**env, variable: wrong_password},
            2,
            refused(login.path[1:]) + f'password authentication failed for user "{login.username}"',
        ),
        "no such database": Case(
            argv,
            {**env, variable: no_database},
            2,
            refused("no_such_database") + 'database "no_such_database" does not exist',
        ),
    }
    if becomes_role:
        cases["no such role"] = Case(
            argv,
            {**env, "CONTEXTCORE_DATABASE_ROLE": "no_such_role"},
            2,
            f"{prog}: the database has no role 'no_such_role' (CONTEXTCORE_DATABASE_ROLE)",
        )
        cases["a role the login is not a member of"] = Case(  # PostgreSQL's own, always there
            argv,
            {**env, "CONTEXTCORE_DATABASE_ROLE": "pg_monitor"},
            2,
            f"{prog}: the database login may not become the service role 'pg_monitor'",
        )
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(CONNECTING))
def test_a_setting_the_database_refuses_for_good_exits_2_naming_it(
    name: str, config: Config, database: Database, tmp_path: Path
) -> None:
    argv, url = CONNECTING[name]
    env = {**config.environ(), OWNER: database.owner_url}
    cases = _refusals(argv, url, env)
    passwords = {urlsplit(env[variable]).password for variable in (URL, OWNER)}

    def outcome(case: Case) -> tuple[int, str, str]:
        code, err = _contextcore(case.argv, case.env, tmp_path)
        return code, _one_line(err), err

    with ThreadPoolExecutor(max_workers=2) as pool:
        got = dict(zip(cases, pool.map(outcome, cases.values()), strict=True))
    wrong = [
        f"{label}: exit {code} {line!r}, not {case.status} {case.line!r}..."
        for (label, case), (code, line, _) in zip(cases.items(), got.values(), strict=True)
        if code != case.status or not line.startswith(case.line)
    ]
    assert not wrong, "\n".join([f"{len(wrong)} of {len(cases)} cases:", *wrong])
    for label, (_, _, err) in got.items():
        assert not any(password and password in err for password in passwords), label
