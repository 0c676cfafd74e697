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

from collections.abc import Sequence
from dataclasses import dataclass

from contextcore.models import (
    CLASS_ORDER,
    ContextBrief,
    ContextItem,
    ContextKind,
    ContextPolicy,
    ResourceRef,
)
from contextcore.tokens import estimate_tokens

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
_BRACKETS = str.maketrans({"[": "(", "]": ")"})


def one_line(text: str) -> str:
    """Collapse each whitespace run (as `str.isspace` defines it) to one space, and strip."""
    return " ".join(text.split())


def _no_bracket(text: str) -> str:
    return text.translate(_BRACKETS)


def written_as_stored(ref: ResourceRef) -> bool:
    """Whether the brief can write ``ref``'s kind and id exactly as stored (so it may be cited)."""
    return all(part and one_line(_no_bracket(part)) == part for part in (ref.kind, ref.id))


@dataclass
class _Candidate:
    item: ContextItem
    source_rank: int
    position: int  # the item's place among its own source's items
    line: str = ""
    charge: int = 0


def _render(item: ContextItem) -> tuple[str, int]:
    """The item's line and its charge: the measured body count plus the frame, or the line.

    Each part takes its own ceiling, so the charge rounds up: over-charging is the safe direction
    against a cap.
    """
    cite = f"[{item.ref.kind}:{item.ref.id}] " if item.ref and written_as_stored(item.ref) else ""
    title, body = one_line(item.title), one_line(item.body)
    frame = f"- {cite}{title}{': ' if body else ''}"
    line = frame + body
    if item.tokens > 0:
        # A source's measured count is trusted upward only: a count below the estimate of the
        # body it rendered would let the brief overrun the total, which is a hard cap.
        return line, max(item.tokens, estimate_tokens(body)) + estimate_tokens(frame + "\n")
    return line, estimate_tokens(line + "\n")


class ContextPacker:
    """Stateless and deterministic: the same items and policy always give the same brief."""

    def pack(
        self,
        items: list[ContextItem],
        policy: ContextPolicy,
        *,
        failed_sources: Sequence[str] = (),
    ) -> ContextBrief:
        source_rank: dict[str, int] = {}
        budgets: dict[str, int] = {}
        for spec in policy.sources:
            if spec.enabled and spec.name not in source_rank:
                source_rank[spec.name] = len(source_rank)
                budgets[spec.name] = spec.token_budget

        dropped: dict[str, int] = {}
        spent: dict[str, int] = {}
        seen_per_source: dict[str, int] = {}
        candidates: list[_Candidate] = []
        for item in items:  # 1. drop what no enabled spec names
            dropped.setdefault(item.source, 0)
            spent.setdefault(item.source, 0)
            position = seen_per_source.get(item.source, 0)
            seen_per_source[item.source] = position + 1
            if item.source not in source_rank:
                dropped[item.source] += 1
                continue
            candidates.append(_Candidate(item, source_rank[item.source], position))

        # 2. pack order
        candidates.sort(key=lambda c: (_CLASS_RANK[c.item.kind], c.source_rank, c.position))

        winners: list[_Candidate] = []  # 3. precedence before spend
        keys: set[str] = set()
        for candidate in candidates:
            key = candidate.item.subject_key
            if key:  # an empty key is no key
                if key in keys:
                    dropped[candidate.item.source] += 1
                    continue
                keys.add(key)
            winners.append(candidate)

        failed = [one_line(name) for name in failed_sources]
        notice = NOTICE_PREFIX + ", ".join(failed) if failed else ""
        notice_tokens = estimate_tokens(notice + "\n") if notice else 0

        total = 0  # 4. spend
        opened: set[ContextKind] = set()
        kept: list[_Candidate] = []
        for candidate in winners:
            item = candidate.item
            candidate.line, candidate.charge = _render(item)
            heading = (
                0 if item.kind in opened else estimate_tokens(SECTION_HEADINGS[item.kind] + "\n")
            )
            fits_source = spent[item.source] + candidate.charge <= budgets[item.source]
            fits_total = total + heading + candidate.charge <= policy.total_token_budget
            if not (fits_source and fits_total):
                dropped[item.source] += 1
                continue
            opened.add(item.kind)
            spent[item.source] += candidate.charge
            total += heading + candidate.charge
            kept.append(candidate)

        lines = [notice] if notice else []  # 5. layout
        cited: list[ResourceRef] = []
        cited_keys: set[tuple[str, str]] = set()
        for kind in _section_order(policy.page_order):
            section = [c for c in kept if c.item.kind == kind]
            if not section:
                continue
            section.sort(key=lambda c: c.item.rank_in_section)  # stable: ties keep spend order
            lines.append(SECTION_HEADINGS[kind])
            for candidate in section:
                lines.append(candidate.line)
                refs = [candidate.item.ref] if candidate.item.ref else []
                for ref in [*refs, *candidate.item.body_refs]:
                    if written_as_stored(ref) and (ref.kind, ref.id) not in cited_keys:
                        cited_keys.add((ref.kind, ref.id))
                        cited.append(ref)

        return ContextBrief(
            text="\n".join(lines),
            items=cited,
            tokens=notice_tokens + total,
            per_source_tokens=spent,
            dropped=dropped,
            failed_sources=failed,
        )


def _section_order(page_order: Sequence[ContextKind]) -> list[ContextKind]:
    first = list(dict.fromkeys(page_order))
    return first + [kind for kind in CLASS_ORDER if kind not in first]
