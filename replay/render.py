"""Readable text for the replay tool's answers (`--json` prints the same data as JSON)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from replay.tool import Item, Result

SOURCES = {"parked": "parked entry", "deadletter": "dead-lettered message",
           "poison": "poison queue envelope"}


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clip(text: str | None, width: int) -> str:
    text = (text or "-").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def items_text(items: Sequence[Item], now: float, *, notes: Sequence[str] = ()) -> str:
    if not items:
        return "\n".join([*notes, "nothing to show"])
    rows = [("ID", "CONSUMER", "REASON", "AGE", "STATE", "KEY")]
    rows += [(item.id, item.consumer, item.reason or "-", age_text(item.age(now)), item.state,
              _clip(item.key, 60)) for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
             + "  " + row[-1] for row in rows]
    by_source = Counter(item.source for item in items)
    lines.append(f"{len(items)} item(s): {by_source.get('parked', 0)} parked, "
                 f"{by_source.get('deadletter', 0)} dead-lettered, "
                 f"{by_source.get('poison', 0)} poisoned")
    return "\n".join([*notes, *lines])


def show_text(item: Item, facts: dict[str, Any], now: float) -> str:
    lines = [f"{item.id}",
             f"  source:    {SOURCES.get(item.source, item.source)}",
             f"  consumer:  {item.consumer}",
             f"  reason:    {item.reason}",
             f"  detail:    {_clip(item.detail, 300)}",
             f"  key:       {item.key or '-'}",
             f"  since:     {when(item.since)} ({age_text(item.age(now))} ago)",
             f"  state:     {item.state}"]
    for name, value in facts.items():
        lines.append(f"  {name + ':':<10} {value}")
    message = item.message
    if message is not None:
        lines += [f"  entity:    {message.entity.path} (sequence number {message.sequence_number}, "
                  f"{message.delivery_count} deliveries)",
                  f"  message:   MessageId={message.message_id} ContentType={message.content_type} "
                  f"CorrelationId={message.correlation_id}",
                  f"  properties: {json.dumps(message.application_properties, default=str)}",
                  f"  body:      {_clip(message.body.decode('utf-8', 'replace'), 500)}"]
    poisoned = item.poisoned
    if poisoned is not None:
        lines.append(f"  queue:     {poisoned.queue.poison} (message {poisoned.id}; resubmitted to "
                     f"{poisoned.queue.queue})")
        envelope = poisoned.envelope
        body = (envelope.get("body") or envelope.get("bodyBase64") if envelope is not None
                else poisoned.text or poisoned.content)
        lines.append(f"  body:      {_clip(str(body), 500)}")
    entry = item.entry
    if entry is not None and item.source == "parked":
        lines += [f"  context:   {json.dumps(entry.context, default=str)}",
                  f"  payload:   {_clip(entry.payload, 500)}"
                  + (" (truncated)" if entry.payload_truncated else "")]
    if entry is not None and entry.history:
        lines.append("  history:")
        for step in entry.history:
            lines.append(f"    {when(step.get('at'))}  {step.get('action')} by {step.get('by')}: "
                         f"{step.get('outcome')}" + (f" (note: {step['note']})" if step.get("note")
                                                     else ""))
    return "\n".join(lines)


def counts_text(counts: Mapping[str, int]) -> str:
    """Results per outcome, e.g. "2 replayed, 1 skipped"."""
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def result_line(result: Result) -> str:
    return f"{result.status:<12} {result.id}: {result.outcome}"


def progress_line(result: Result, done: int, total: int, counts: Mapping[str, int]) -> str:
    """One item as it completes: its place, its result, and the tally so far."""
    width = len(str(total))
    return f"[{done:>{width}}/{total}] {result_line(result)} ({counts_text(counts)})"


def results_text(results: Sequence[Result]) -> str:
    if not results:
        return "nothing selected"
    lines = [result_line(r) for r in results]
    lines.append(counts_text(Counter(r.status for r in results)))
    return "\n".join(lines)
