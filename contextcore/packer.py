"""The packer: items in, one deterministic brief out, inside the budgets.

The order of operations is the contract (``spec/context-layer.md``, "What precedence actually
does" and "Budgets and metadata"):

1. **Unenabled first.** An item whose source no enabled spec names is dropped and counted before
   anything else, so it can neither spend a budget it was not given nor win a subject key.
2. **Pack order.** Class order (``CLASS_ORDER``), then the policy order of the enabled sources,
   then each source's own order. Only the position *within* a source comes from the input, so
   the brief does not depend on the order in which concurrent sources answered.
3. **Precedence before spend.** Walking the pack order, the first item with a given complete
   ``subject_key`` stays (a higher class, or the first of one class); later ones are dropped and
   counted. A loser never eats budget a winner then lacks.
4. **Spend.** Whole items only, in pack order: an item is admitted when its charge fits its
   source's ``token_budget`` and, with its section heading on the section's first item, the
   total. A dropped item costs nothing. The unavailable-source notice comes first and is the one
   cost the total does not cap; ``ContextBrief.tokens`` reports it anyway.
5. **Layout.** Kept sections render in ``page_order`` and then class order; inside a section a
   higher ``rank_in_section`` renders lower, ties keep spend order. Layout never changes what
   step 4 kept.

Rendering is one item per line, ``- [kind:id] Title: body``, with every whitespace run in a title,
a body and a failed source name collapsed to one space: no body can open a section, and only the
packer writes ``## `` headings. A ref is cited (shown in the frame, listed in ``items``) only
when it is written exactly as stored; a ref the packer had to rewrite is never listed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from contextcore.tokens import estimate_tokens
from schemas.context import (
    CLASS_ORDER,
    KEPT,
    LOST_KEY_TO,
    OVER_SOURCE_BUDGET,
    OVER_TOTAL_BUDGET,
    SOURCE_NOT_ENABLED,
    ContextBrief,
    ContextItem,
    ContextKind,
    ContextPolicy,
    ManifestEntry,
    ResourceRef,
)

SECTION_HEADINGS: dict[ContextKind, str] = {
    "conversation": "## Conversation",
    "outreach_thread": "## Outreach thread",
    "outreach": "## Outreach",
    "personal_memory": "## Personal memory",
    "application": "## Application state",
    "dossier": "## Company dossier",
    "definition_summary": "## Agents, workflows and skills",
    "knowledge": "## Knowledge",
    "memory": "## Memory",
    "run_history": "## Run history",
}
NOTICE_PREFIX = "Unavailable sources (their facts are missing from this brief): "
_CLASS_RANK = {kind: rank for rank, kind in enumerate(CLASS_ORDER)}
_HEADING_TOKENS = {kind: estimate_tokens(h + "\n") for kind, h in SECTION_HEADINGS.items()}


def one_line(text: str) -> str:
    """Collapse each whitespace run (as `str.isspace` defines it) to one space, and strip."""
    # Fast path: isprintable() is False for every whitespace character but the ASCII space, so
    # a printable text with no double, leading or trailing space is already one line.
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


_BRACKET_OR_SPACE = re.compile(r"[\[\]\s]")


def _unchanged(part: str) -> bool:
    if not part:
        return False
    if _BRACKET_OR_SPACE.search(part) is None:  # the common case: a plain identifier
        return True
    return "[" not in part and "]" not in part and one_line(part) == part


def written_as_stored(ref: ResourceRef) -> bool:
    """Whether the brief can write ``ref``'s kind and id exactly as stored (so it may be cited).

    The frame rewrites a bracket (``[kind:id]`` must stay parseable) and every whitespace run;
    a ref either rewrite would change is never cited, because a citation of the rewritten text
    would name a row that does not exist.
    """
    return _unchanged(ref.kind) and _unchanged(ref.id)


def _render(item: ContextItem, cites_ref: bool) -> tuple[str, int]:
    """The item's line and its charge: the measured body count plus the frame, or the line.

    Each part takes its own ceiling, so the charge rounds up: over-charging is the safe direction
    against a cap. A measured count is trusted upward only: a count below the estimate of the
    body it rendered would let the brief overrun the total, which is a hard cap.
    """
    ref = item.ref
    cite = f"[{ref.kind}:{ref.id}] " if ref is not None and cites_ref else ""
    title, body = one_line(item.title), one_line(item.body)
    frame = f"- {cite}{title}: " if body else f"- {cite}{title}"
    line = frame + body
    if item.tokens > 0:
        return line, max(item.tokens, estimate_tokens(body)) + estimate_tokens(frame + "\n")
    return line, estimate_tokens(line + "\n")


NOT_ENABLED = "not_enabled"
"""Drop reason: no enabled spec names the item's source (step 1)."""
OUTRANKED = "outranked"
"""Drop reason: an item earlier in pack order holds its subject key (step 3)."""
OVER_SOURCE = OVER_SOURCE_BUDGET
"""Drop reason: it does not fit what is left of its source's budget (step 4)."""
OVER_TOTAL = OVER_TOTAL_BUDGET
"""Drop reason: it fits its source's budget but not what is left of the total (step 4)."""
DROP_REASONS = (NOT_ENABLED, OUTRANKED, OVER_SOURCE, OVER_TOTAL)


class ContextPacker:
    """Stateless and deterministic: the same items and policy always give the same brief."""

    def pack(
        self,
        items: list[ContextItem],
        policy: ContextPolicy,
        *,
        failed_sources: Sequence[str] = (),
        on_drops: Callable[[Mapping[tuple[str, str], int]], None] | None = None,
    ) -> ContextBrief:
        """The brief; ``on_drops`` (metrics) hears the dropped items by (source, reason), the
        reasons of :data:`DROP_REASONS`. Their sum per source is ``ContextBrief.dropped``."""
        return self._pack(items, policy, failed_sources, on_drops, None)

    def pack_explained(
        self,
        items: list[ContextItem],
        policy: ContextPolicy,
        *,
        failed_sources: Sequence[str] = (),
        on_drops: Callable[[Mapping[tuple[str, str], int]], None] | None = None,
    ) -> tuple[ContextBrief, list[ManifestEntry]]:
        """The same brief as :meth:`pack`, and an entry for every item: kept, or why not
        (``schemas.context.ManifestEntry``). The entries of items no enabled spec names come
        first, by source name and then each source's order; the rest follow in pack order. Like
        the brief, the entries do not depend on the order in which the sources answered."""
        entries: list[ManifestEntry] = []
        return self._pack(items, policy, failed_sources, on_drops, entries), entries

    def _pack(
        self,
        items: list[ContextItem],
        policy: ContextPolicy,
        failed_sources: Sequence[str],
        on_drops: Callable[[Mapping[tuple[str, str], int]], None] | None,
        entries: list[ManifestEntry] | None,
    ) -> ContextBrief:
        """``entries``, when given, receives the manifest: the brief does not depend on it."""
        tally = _Tally(entries)
        ordered = _in_pack_order(items, policy, tally)  # 1 and 2
        failed = [one_line(name) for name in failed_sources]
        notice = NOTICE_PREFIX + ", ".join(failed) if failed else ""
        notice_tokens = estimate_tokens(notice + "\n") if notice else 0
        sections, total = _spend(ordered, policy, tally)  # 3 and 4
        lines, cited = _layout(sections, policy.page_order)  # 5
        if on_drops is not None and tally.reasons:
            on_drops(tally.reasons)
        return ContextBrief(
            text="\n".join([notice, *lines] if notice else lines),
            items=cited,
            tokens=notice_tokens + total,
            per_source_tokens=tally.spent,
            dropped=tally.dropped,
            failed_sources=failed,
        )


@dataclass
class _Tally:
    """One pack's accounts: the drops per source and per (source, reason), the tokens each
    source spent, and the manifest when one is asked for."""

    entries: list[ManifestEntry] | None
    dropped: dict[str, int] = field(default_factory=dict)
    reasons: dict[tuple[str, str], int] = field(default_factory=dict)
    spent: dict[str, int] = field(default_factory=dict)

    def drop(self, item: ContextItem, reason: str, outcome: str | None = None) -> None:
        """``item`` dropped for ``reason`` (its manifest entry says ``outcome``, the reason
        unless given)."""
        self.dropped[item.source] += 1
        key = (item.source, reason)
        self.reasons[key] = self.reasons.get(key, 0) + 1
        if self.entries is not None:
            self.entries.append(_entry(item, outcome or reason))


_Ordered = tuple[int, int, int, ContextItem]
_Line = tuple[int, str, ContextItem, bool]


def _in_pack_order(
    items: list[ContextItem], policy: ContextPolicy, tally: _Tally
) -> list[_Ordered]:
    """1. The items an enabled spec names, the others dropped; 2. in pack order: class, policy
    rank, place in source. The manifest gets the unnamed ones first, by source name then each
    source's order, so it does not depend on the order the sources answered in."""
    source_rank: dict[str, int] = {}
    for spec in policy.sources:
        if spec.enabled and spec.name not in source_rank:
            source_rank[spec.name] = len(source_rank)
    seen_per_source: dict[str, int] = {}
    ordered: list[_Ordered] = []
    unenabled: list[tuple[str, int, ContextItem]] = []
    for item in items:
        source = item.source
        position = seen_per_source.get(source, 0)
        seen_per_source[source] = position + 1
        if position == 0:
            tally.dropped[source] = tally.spent[source] = 0
        rank = source_rank.get(source)
        if rank is None:
            unenabled.append((source, position, item))
            continue
        # (class, policy rank, place in source) is unique, so items are never compared
        ordered.append((_CLASS_RANK[item.kind], rank, position, item))
    for _, _, item in sorted(unenabled, key=itemgetter(0, 1)):
        tally.drop(item, NOT_ENABLED, SOURCE_NOT_ENABLED)
    ordered.sort()
    return ordered


def _spend(
    ordered: list[_Ordered], policy: ContextPolicy, tally: _Tally
) -> tuple[dict[ContextKind, list[_Line]], int]:
    """3. Precedence before spend: the first item of a subject key wins it; 4. each item that
    fits what is left of its source's budget and of the total is rendered and kept. The kept
    lines by section, and the tokens they and their headings spent."""
    budgets: dict[str, int] = {}
    for spec in policy.sources:
        if spec.enabled:
            budgets.setdefault(spec.name, spec.token_budget)
    spent, total, limit = tally.spent, 0, policy.total_token_budget
    keys: dict[str, ContextItem] = {}  # each subject key's winner
    sections: dict[ContextKind, list[_Line]] = {}
    for _, _, _, item in ordered:
        key = item.subject_key
        if key:  # an empty key is no key
            winner = keys.get(key)
            if winner is not None:
                tally.drop(item, OUTRANKED, _lost_to(winner))
                continue
            keys[key] = item
        kind, source = item.kind, item.source
        if spent[source] >= budgets[source] or total >= limit:
            # every line costs at least one token: skip the render
            tally.drop(item, OVER_SOURCE if spent[source] >= budgets[source] else OVER_TOTAL)
            continue
        cites_ref = item.ref is not None and written_as_stored(item.ref)
        line, charge = _render(item, cites_ref)
        heading = 0 if kind in sections else _HEADING_TOKENS[kind]
        if spent[source] + charge > budgets[source] or total + heading + charge > limit:
            over = OVER_SOURCE if spent[source] + charge > budgets[source] else OVER_TOTAL
            tally.drop(item, over)
            continue
        if tally.entries is not None:
            tally.entries.append(_entry(item, KEPT, charge))
        spent[source] += charge
        total += heading + charge
        sections.setdefault(kind, []).append((item.rank_in_section, line, item, cites_ref))
    return sections, total


def _layout(
    sections: dict[ContextKind, list[_Line]], page_order: Sequence[ContextKind]
) -> tuple[list[str], list[ResourceRef]]:
    """5. The sections in page order, each under its heading, its lines by rank (stable: equal
    ranks keep spend order); and the refs the text cites, each once, in the order cited."""
    lines: list[str] = []
    cited: list[ResourceRef] = []
    cited_keys: set[tuple[str, str]] = set()
    for kind in _section_order(page_order):
        section = sections.get(kind)
        if not section:
            continue
        section.sort(key=itemgetter(0))
        lines.append(SECTION_HEADINGS[kind])
        for _, line, item, cites_ref in section:
            lines.append(line)
            own = [item.ref] if item.ref is not None and cites_ref else []
            for ref in own + [r for r in item.body_refs if written_as_stored(r)]:
                if (ref.kind, ref.id) not in cited_keys:
                    cited_keys.add((ref.kind, ref.id))
                    cited.append(ref)
    return lines, cited


def _ref_text(ref: ResourceRef | None) -> str | None:
    return None if ref is None else f"{ref.kind}:{ref.id}"


def _entry(item: ContextItem, outcome: str, tokens: int = 0) -> ManifestEntry:
    return ManifestEntry(
        source=item.source,
        kind=item.kind,
        ref=_ref_text(item.ref),
        subject_key=item.subject_key,
        tokens=tokens,
        outcome=outcome,
    )


def _lost_to(winner: ContextItem) -> str:
    """``lost_key_to:<source>:<kind>:<id>``, or ``lost_key_to:<source>`` for a winner with no
    ref."""
    ref = _ref_text(winner.ref)
    return f"{LOST_KEY_TO}:{winner.source}" + (f":{ref}" if ref is not None else "")


def _section_order(page_order: Sequence[ContextKind]) -> list[ContextKind]:
    first = list(dict.fromkeys(page_order))
    return first + [kind for kind in CLASS_ORDER if kind not in first]
