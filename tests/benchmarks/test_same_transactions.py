"""The `same-transactions` variant sends exactly the app's requests, with no library code on
its hot path; its templates are learnt from the app and refuse what they cannot write."""

from __future__ import annotations

import ast
import contextlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.raw_payments as raw
from benchmarks.app_requests import TemplateError, learn
from benchmarks.counting import Endpoints, SentRequest
from benchmarks.runner import Stores, _slots, app_env
from benchmarks.variants import LATENCY_VARIANTS
from benchmarks.workload import build_payment_workload

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("shared", "domain", "functions")
FROZEN = 1_767_300_000.5  # the app's and the variant's clock: their markers' times agree


def library_imports(module: str) -> tuple[set[str], str]:
    """What `benchmarks/<module>.py` imports of the library, by its source and once loaded."""
    tree = ast.parse((ROOT / "benchmarks" / f"{module}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, benchmarks.{module}; "
         f"print(sorted({{n.split('.')[0] for n in sys.modules}} & {set(LIBRARY)!r}))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    return {name for name in imported if name.split(".")[0] in LIBRARY}, loaded


def test_its_hot_path_imports_no_library_code():
    assert library_imports("raw_payments") == (set(), "[]")


# -- learning: a slot when a value fits every document, a constant when all agree, else refused --
def _facts(balance: int) -> raw.BalanceFacts:
    return raw.BalanceFacts(f"acct/{balance}", f"acct!2F{balance}", balance, balance // 10)


def test_a_template_takes_slots_and_constants_from_the_apps_documents():
    documents = [({"accountId": f"acct/{b}", "balanceCents": b, "version": b // 10,
                   "kind": "account", "pk": f"acct!2F{b}"}, _facts(b)) for b in (120, 250)]
    template = learn("balance", documents, raw.BALANCE_SLOTS)
    assert template.slots == ("account", "balance", "version", None, "partition")
    assert template.build(_facts(990)) == {"accountId": "acct/990", "balanceCents": 990,
                                           "version": 99, "kind": "account", "pk": "acct!2F990"}


def test_a_field_the_variant_cannot_compute_stops_the_set_up():
    documents = [({"balanceCents": b, "checksum": f"x{b}"}, _facts(b)) for b in (120, 250)]
    with pytest.raises(TemplateError, match="balance field 'checksum'"):
        learn("balance", documents, raw.BALANCE_SLOTS)


def test_a_number_is_not_its_float_or_its_text():
    documents = [({"balanceCents": float(b)}, _facts(b)) for b in (120, 250)]
    with pytest.raises(TemplateError, match="'balanceCents'"):
        learn("balance", documents, raw.BALANCE_SLOTS)


# -- on the servers: the app's requests and the variant's, batch by batch ------------------------
_NOT_COMPARED = {"authorization", "x-ms-date", "date", "user-agent", "x-ms-client-request-id",
                 "x-ms-activity-id", "x-ms-client-id", "x-ms-session-token", "content-length",
                 "x-ms-cosmos-intended-collection-rid", "traceparent"}


def _normal(request: SentRequest, names: dict[str, str]) -> tuple[str, str, tuple, str]:
    """A request with what must differ between two runs taken out: the tables / containers'
    names (each variant has its own), multipart boundaries, dates, the etags of conditions
    (the servers' values), credentials and client ids. Everything else, bodies included,
    is compared as sent."""
    def text(value: str) -> str:
        for name, role in names.items():
            value = value.replace(name, f"<{role}>")
        value = re.sub(r"https?://[^/\s]+", "", value)
        value = re.sub(r"(batch|changeset)_[0-9a-f-]{36}", r"\1_<id>", value)
        value = re.sub(r"(x-ms-date|Date): [^\r\n]+", r"\1: <date>", value)
        value = re.sub(r"If-Match: [^\r\n]+", "If-Match: <etag>", value)
        return re.sub(r'"ifMatch": ?"[^"]*"', '"ifMatch": "<etag>"', value)
    headers = tuple(sorted((k.lower(), "<etag>" if k.lower() == "if-match" else text(v))
                           for k, v in request.headers.items() if k.lower() not in _NOT_COMPARED))
    return request.method, text(request.url), headers, text(request.body.decode("utf-8"))


def _names(variant) -> dict[str, str]:
    return {(store.container.id if hasattr(store, "container") else store.client.table_name): role
            for role, store in variant.stores.aio.items()}


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_it_sends_exactly_the_apps_requests_per_batch(stack, backend):
    """Same clock, same batches: every request of a batch (reads, each transaction with every
    marker, balance and the mark, byte for byte) is the app's, and so are the messages."""
    endpoints = Endpoints(stack.table_connection_string, stack.cosmos_endpoint, stack.cosmos_key,
                          stack.cosmos_verify)
    workload = build_payment_workload(events=30, accounts=4, batch_size=10, seed=11,
                                      warmup_events=10)
    with Stores(endpoints) as stores, _slots(
            stores, LATENCY_VARIANTS, ("app", "same-transactions"), (backend,), main="batches",
            env=lambda b: app_env(b, endpoints), clock=lambda: FROZEN) as slots:
        for slot in slots:  # the SDKs' first requests (account, containers) are not the point
            slot.variant.process(workload.warmup, "warmup")
        sent: dict[str, list[list[tuple]]] = {}
        for slot in slots:
            batches = [*workload.batches, "restart", workload.batches[-1]]
            sent[slot.result.name] = []
            for batch in batches:
                if batch == "restart":
                    slot.variant.restart()
                    continue
                before = (slot.tally.sends, slot.tally.messages)
                with contextlib.ExitStack() as stack_:
                    logs = [stack_.enter_context(c.recording()) for c in slot.counters]
                    slot.variant.process(batch, "0")
                requests = sorted(_normal(r, _names(slot.variant)) for log in logs for r in log)
                sent[slot.result.name].append(
                    [(slot.tally.sends - before[0], slot.tally.messages - before[1]), *requests])
        app, same = sent["app"], sent["same-transactions"]
        assert len(app) == len(same) == len(workload.batches) + 1
        for index, (ours, theirs) in enumerate(zip(same, app, strict=True)):
            assert ours == theirs, f"batch {index}"
        transactions = sum(1 for batch in app for r in batch[1:] if r[0] == "POST")
        assert transactions >= 2 * len(workload.batches)  # the groups' and the marks' writes
        assert len(app[-1]) == 2 and app[-1][1][0] == "GET"  # the replay: the mark read only
        assert sum(batch[0][1] for batch in app) > 0  # BalanceChanged were sent, and compared
