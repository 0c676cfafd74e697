"""contextcore's Grafana dashboards, as code (grafana-foundation-sdk, pinned in pyproject).

    python -m monitoring.dashboards          write monitoring/grafana/dashboards/*.json
    python -m monitoring.dashboards --check  fail when a checked-in file differs (CI)

Each dashboard is a list of panels; each panel is a title, a unit and PromQL queries over the
series the consumers export (docs/operations.md). :func:`queries` lists every panel's queries
for the test that runs them through a real Prometheus: no panel may come back empty. Queries
use Grafana's ``$__rate_interval``; that test substitutes a window.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

OUT = Path(__file__).resolve().parent / "grafana" / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    stat: bool = False  # a single number, not a graph
    width: int = 12


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: dict[str, list[Panel]] = field(default_factory=dict)


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


def quantiles(metric: str, selector: str, by: str = "", legend: str = "") -> tuple[Query, ...]:
    """p50, p95 and p99 of a histogram, per ``by`` when given."""
    group = f"le, {by}" if by else "le"
    name = f"{legend} " if legend else ""
    return tuple(
        q(
            f"histogram_quantile({p}, sum by ({group}) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{name}p{int(p * 100)}" if not by else f"{{{{{by}}}}} p{int(p * 100)}",
        )
        for p in (0.5, 0.95, 0.99)
    )


BUILD = 'consumer="build", stage="build"'

# panels two dashboards show
BUILDS_BY_OUTCOME = Panel(
    "Builds by outcome",
    "reqps",
    (
        q(
            f"sum by (outcome) (rate(contextcore_build_requests_total[{RATE}]))",
            "{{outcome}}",
        ),
    ),
)
BUILD_LATENCY = Panel(
    "Build latency (target p99 50 ms)",
    "s",
    quantiles("contextcore_consumer_stage_seconds", BUILD),
)
UPLOADS_BY_OUTCOME = Panel(
    "Uploads by outcome",
    "ops",
    (q(f"sum by (outcome) (rate(contextcore_uploads_total[{RATE}]))", "{{outcome}}"),),
)
MEMORIES_DROPPED = Panel(
    "Memories dropped at read",
    "ops",
    (
        q(
            f"sum by (reason) (rate(contextcore_memories_dropped_total[{RATE}]))",
            "{{reason}}",
        ),
    ),
    description="unresolved_ref is the tenant guard: a ref that does not resolve for this subject.",
)

OVERVIEW = Board(
    "contextcore-overview",
    "contextcore / Overview",
    "Is contextcore answering, how fast, and is anything stuck or dead-lettered.",
    {
        "Traffic": [
            BUILDS_BY_OUTCOME,
            BUILD_LATENCY,
            Panel(
                "Memory writes by outcome",
                "ops",
                (
                    q(
                        "sum by (operation, outcome) "
                        f"(rate(contextcore_memory_writes_total[{RATE}]))",
                        "{{operation}} {{outcome}}",
                    ),
                ),
            ),
            UPLOADS_BY_OUTCOME,
        ],
        "Health": [
            Panel(
                "Dead letters in the last hour",
                "short",
                (q("sum(increase(contextcore_dead_letters_total[1h]))"),),
                stat=True,
                width=6,
            ),
            Panel(
                "Records waiting (lag)",
                "short",
                (q("sum(contextcore_consumer_lag_records)"),),
                stat=True,
                width=6,
            ),
            Panel(
                "Oldest record in flight",
                "s",
                (q("max(contextcore_consumer_oldest_in_flight_age_seconds)"),),
                stat=True,
                width=6,
            ),
            Panel(
                "Database schema",
                "short",
                (q("count by (migration) (contextcore_schema_info)", "{{migration}}"),),
                description="Processes per schema version: two versions mean a rollout in "
                "progress.",
                stat=True,
                width=6,
            ),
        ],
    },
)

BUILDS = Board(
    "contextcore-builds",
    "contextcore / Builds and sources",
    "Each build reads its sources concurrently, time-boxed, then packs a brief into the budgets.",
    {
        "Builds": [
            BUILDS_BY_OUTCOME,
            BUILD_LATENCY,
            Panel(
                "Builds throttled, by organization (over its rate; the first 50, then other)",
                "reqps",
                (
                    q(
                        "topk(10, sum by (organization) "
                        f"(rate(contextcore_build_throttled_total[{RATE}])))",
                        "{{organization}}",
                    ),
                ),
            ),
            Panel(
                "Tokens per brief",
                "short",
                tuple(
                    q(
                        f"histogram_quantile({p}, sum by (le) "
                        f"(rate(contextcore_brief_tokens_bucket[{RATE}])))",
                        f"p{int(p * 100)}",
                    )
                    for p in (0.5, 0.95)
                ),
            ),
            Panel(
                "Tokens spent per source",
                "short",
                (
                    q(
                        f"sum by (source) (rate(contextcore_source_tokens_total[{RATE}]))",
                        "{{source}}",
                    ),
                ),
                description="Tokens per second the briefs spent on each source's items.",
            ),
        ],
        "Sources": [
            Panel(
                "Read database behind its primary (0: the sources read the primary)",
                "s",
                (
                    q(
                        "max by (instance) (contextcore_database_replica_lag_seconds)",
                        "{{instance}}",
                    ),
                ),
                description="CONTEXTCORE_DATABASE_READ_URL's lag, as each build process reads it "
                "(docs/scaling.md).",
            ),
            Panel(
                "Builds that named a position, by the database that served them",
                "ops",
                (
                    q(
                        f"sum by (database) (rate(contextcore_build_read_after_total[{RATE}]))",
                        "{{database}}",
                    ),
                ),
                description="Read-your-writes (docs/scaling.md): replica (it had replayed the "
                "write), primary (it had not: the lag's cost), ignored (a position the primary "
                "never wrote).",
            ),
            Panel(
                "Source read latency p95",
                "s",
                (
                    q(
                        "histogram_quantile(0.95, sum by (le, source) "
                        f"(rate(contextcore_source_read_seconds_bucket[{RATE}])))",
                        "{{source}}",
                    ),
                ),
            ),
            Panel(
                "Source failures by cause",
                "ops",
                (
                    q(
                        f"sum by (source, cause) (rate(contextcore_source_failures_total[{RATE}]))",
                        "{{source}} {{cause}}",
                    ),
                ),
            ),
            Panel(
                "Items dropped by the packer",
                "ops",
                (
                    q(
                        f"sum by (source, reason) (rate(contextcore_items_dropped_total[{RATE}]))",
                        "{{source}} {{reason}}",
                    ),
                ),
                description="not_enabled: no enabled spec names the source; outranked: a "
                "higher item holds the subject key; over_source_budget: it did not fit its "
                "source's budget; over_total_budget: it fit its source's but not the total. "
                "A build request with explain: true lists each item and its reason.",
            ),
            Panel(
                "Briefs that hit the total budget",
                "percentunit",
                (
                    q(
                        f"sum(rate(contextcore_briefs_at_total_budget_total[{RATE}])) / "
                        "sum(rate(contextcore_build_requests_total"
                        f'{{outcome="ok"}}[{RATE}]))',
                        "share of ok builds",
                    ),
                ),
                description="Briefs that left an item out because the total budget was full, "
                "as a share of the briefs built: policies whose sources together want more "
                "than the total gives them.",
            ),
            MEMORIES_DROPPED,
            Panel(
                "Source cache hit rate",
                "percentunit",
                (
                    q(
                        "sum by (cache) (rate(contextcore_source_cache_requests_total"
                        f'{{outcome="hit"}}[{RATE}])) / sum by (cache) '
                        f"(rate(contextcore_source_cache_requests_total[{RATE}]))",
                        "{{cache}}",
                    ),
                ),
                description="Reads of the per-organization caches (dossier, definition "
                "summaries) answered without the database; a write drops an organization's "
                "entries in every process.",
            ),
            Panel(
                "Database round trips per build",
                "short",
                (
                    q(
                        f"sum(rate(contextcore_database_round_trips_total[{RATE}])) / "
                        f"sum(rate(contextcore_build_requests_total[{RATE}]))",
                        "round trips",
                    ),
                ),
                description="Statements, scope entries and commits the sources sent PostgreSQL "
                "per answered request (issue 20: at most 5 for a typical build).",
            ),
        ],
    },
)

INGESTION = Board(
    "contextcore-ingestion",
    "contextcore / Ingestion and embeddings",
    "Uploads are extracted and chunked, embedded by the embedding group, stored in pgvector; a "
    "source pending past its hour is failed by the sweep.",
    {
        "Uploads": [
            UPLOADS_BY_OUTCOME,
            Panel(
                "Embedding batches published and sources ready",
                "ops",
                (
                    q(f"sum(rate(contextcore_embed_batches_published_total[{RATE}]))", "batches"),
                    q(f"sum(rate(contextcore_knowledge_sources_ready_total[{RATE}]))", "ready"),
                ),
            ),
        ],
        "Embeddings": [
            Panel(
                "Chunks embedded by model",
                "ops",
                (
                    q(
                        f"sum by (model) (rate(contextcore_chunks_embedded_total[{RATE}]))",
                        "{{model}}",
                    ),
                ),
            ),
            Panel(
                "Embedding batch latency",
                "s",
                quantiles("contextcore_embed_batch_seconds", ""),
            ),
            Panel(
                "Encoder call latency (what a small upload waits for, at most, beside a flood)",
                "s",
                quantiles("contextcore_embed_encode_seconds", "", by="model"),
            ),
            Panel(
                "Chunks per embedding batch",
                "short",
                tuple(
                    q(
                        f"histogram_quantile({p}, sum by (le) "
                        f"(rate(contextcore_embed_batch_chunks_bucket[{RATE}])))",
                        f"p{int(p * 100)}",
                    )
                    for p in (0.5, 0.95)
                ),
            ),
            Panel(
                "Embedding lag",
                "short",
                (
                    q(
                        'sum by (topic) (contextcore_consumer_lag_records{consumer="embed"})',
                        "{{topic}}",
                    ),
                ),
            ),
        ],
        "Sources and the sweep": [
            Panel(
                "Knowledge sources by status",
                "short",
                (q("max by (status) (contextcore_knowledge_sources)", "{{status}}"),),
                description="Every tenant's sources, counted by the sweep after each run.",
            ),
            Panel(
                "Oldest pending source",
                "s",
                (q("max(contextcore_knowledge_oldest_pending_seconds)"),),
                description="The sweep fails a source pending for an hour.",
                stat=True,
                width=4,
            ),
            Panel(
                "Tenants without their index",
                "short",
                (q("max(contextcore_knowledge_tenants_without_index)"),),
                description="Tenants past the index threshold still searched by an exact scan.",
                stat=True,
                width=4,
            ),
            Panel(
                "Sources failed by the sweep (1h)",
                "short",
                (q("sum(increase(contextcore_knowledge_sources_swept_total[1h]))"),),
                stat=True,
                width=4,
            ),
            Panel(
                "Since the last sweep",
                "s",
                (q("time() - max(contextcore_sweep_last_success_timestamp_seconds)"),),
                stat=True,
                width=4,
            ),
        ],
    },
)

MEMORY = Board(
    "contextcore-memory",
    "contextcore / Memory and its hygiene",
    "memory.remember and memory.forget calls, the revisions they append, and what reading "
    "memory leaves out.",
    {
        "Writes": [
            Panel(
                "Writes by operation and outcome",
                "ops",
                (
                    q(
                        "sum by (operation, outcome) "
                        f"(rate(contextcore_memory_writes_total[{RATE}]))",
                        "{{operation}} {{outcome}}",
                    ),
                ),
            ),
            Panel(
                "Refusals by reason",
                "ops",
                (
                    q(
                        "sum by (reason) "
                        f'(rate(contextcore_memory_writes_total{{outcome="refused"}}[{RATE}]))',
                        "{{reason}}",
                    ),
                ),
            ),
            Panel(
                "Revisions by change",
                "ops",
                (
                    q(
                        f"sum by (change) (rate(contextcore_memory_revisions_total[{RATE}]))",
                        "{{change}}",
                    ),
                ),
                description="superseded, forgotten (tombstones), revived, created.",
            ),
            Panel(
                "Write latency",
                "s",
                quantiles("contextcore_consumer_stage_seconds", 'consumer="memory", stage="apply"'),
            ),
            Panel(
                "Chain length at write",
                "short",
                quantiles("contextcore_memory_chain_length", ""),
                description="Revisions of the chain each write appended to (a tombstone counts). "
                "A long chain is one fact rewritten again and again; contextcore memory health "
                "shows one organization's chains.",
            ),
        ],
        "Reading": [
            replace(MEMORIES_DROPPED, width=24),
        ],
    },
)

KAFKA = Board(
    "contextcore-kafka",
    "contextcore / Kafka lag and dead letters",
    "Per consumer: what waits, what is in flight, what was retried or dead-lettered.",
    {
        "Lag": [
            Panel(
                "Lag by partition",
                "short",
                (
                    q(
                        "sum by (consumer, topic, partition) (contextcore_consumer_lag_records)",
                        "{{consumer}} {{topic}}[{{partition}}]",
                    ),
                ),
            ),
            Panel(
                "Oldest record in flight",
                "s",
                (
                    q(
                        "max by (consumer, topic, partition) "
                        "(contextcore_consumer_oldest_in_flight_age_seconds)",
                        "{{consumer}} {{topic}}[{{partition}}]",
                    ),
                ),
            ),
            Panel(
                "Records settled by outcome",
                "ops",
                (
                    q(
                        "sum by (consumer, outcome) "
                        f"(rate(contextcore_consumer_records_total[{RATE}]))",
                        "{{consumer}} {{outcome}}",
                    ),
                ),
            ),
            Panel(
                "In flight",
                "short",
                (q("sum by (consumer) (contextcore_consumer_in_flight)", "{{consumer}}"),),
            ),
            Panel(
                "Waiting in organization lanes (read ahead of the slots)",
                "short",
                (q("sum by (consumer) (contextcore_consumer_waiting)", "{{consumer}}"),),
            ),
        ],
        "Failures": [
            Panel(
                "Dead letters by topic and cause",
                "short",
                (
                    q(
                        f"sum by (topic, cause) (increase(contextcore_dead_letters_total[{RATE}]))",
                        "{{topic}} {{cause}}",
                    ),
                ),
            ),
            Panel(
                "Retries by cause",
                "ops",
                (
                    q(
                        "sum by (consumer, cause) "
                        f"(rate(contextcore_consumer_retries_total[{RATE}]))",
                        "{{consumer}} {{cause}}",
                    ),
                ),
            ),
            Panel(
                "Publishes the broker refused",
                "ops",
                (
                    q(
                        "sum by (consumer, kind) "
                        f"(rate(contextcore_consumer_publish_failures_total[{RATE}]))",
                        "{{consumer}} {{kind}}",
                    ),
                ),
            ),
            Panel(
                "Offset commits by result",
                "ops",
                (
                    q(
                        "sum by (consumer, result) "
                        f"(rate(contextcore_consumer_commits_total[{RATE}]))",
                        "{{consumer}} {{result}}",
                    ),
                ),
            ),
        ],
    },
)

BOARDS = (OVERVIEW, BUILDS, INGESTION, MEMORY, KAFKA)


def dashboard(board: Board) -> Dashboard:
    built = (
        Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(["contextcore", "generated"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for row, panels in board.rows.items():
        built = built.with_row(Row(row))
        for panel in panels:
            built = built.with_panel(_panel(panel))
    return built


def _panel(panel: Panel) -> StatPanel | TimeseriesPanel:
    built = (StatPanel() if panel.stat else TimeseriesPanel()).title(panel.title)
    built = built.datasource(DATASOURCE).unit(panel.unit).height(8).span(panel.width)
    if panel.description:
        built = built.description(panel.description)
    for ref, query in zip("ABCDEFGH", panel.queries, strict=False):
        target = Dataquery().expr(query.expr).ref_id(ref).datasource(DATASOURCE)
        if query.legend:
            target = target.legend_format(query.legend)
        if panel.stat:
            target = target.instant()
        built = built.with_target(target)
    return built


def render(board: Board) -> str:
    return json.dumps(dashboard(board).build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) of every query of every panel."""
    return [
        (board.uid, panel.title, query.expr)
        for board in BOARDS
        for panels in board.rows.values()
        for panel in panels
        for query in panel.queries
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when a file is out of date")
    args = parser.parse_args(argv)
    expected = {OUT / f"{board.uid}.json": render(board) for board in BOARDS}
    stale = sorted(
        path.name
        for path in {*expected, *OUT.glob("*.json")}
        if not path.is_file() or path.read_text() != expected.get(path)
    )
    if args.check:
        if stale:
            print(
                f"dashboards out of date: {', '.join(stale)}; run python -m monitoring.dashboards",
                file=sys.stderr,
            )
            return 1
        print(f"{len(expected)} dashboards match their code")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path in OUT.glob("*.json"):
        if path not in expected:
            path.unlink()
    for path, text in expected.items():
        path.write_text(text)
    print(f"wrote {len(expected)} dashboards to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
