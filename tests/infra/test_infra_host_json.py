"""host.json: every setting acts on these triggers, and the docs (docs/deploy.md) explain each one.

What acts where comes from the extensions' options (Microsoft.Azure.WebJobs.Extensions.ServiceBus
ServiceBusOptions, ...EventHubs EventHubOptions): Service Bus batch options apply only to functions
that receive a batch, a trigger's own autoCompleteMessages overrides the host's, and the Event Hubs
maxWaitTime is read only when minEventBatchSize is above 1. The triggers' shapes are read from the
indexed app, so a new batch trigger makes the batch options meaningful again.
"""

from __future__ import annotations

import json
import re

from tests.functions.conftest import registered_functions
from tests.infra.bicep_model import REPO

HOST = json.loads((REPO / "host.json").read_text())
SERVICE_BUS_BATCH_ONLY = ("maxMessageBatchSize", "minMessageBatchSize", "maxBatchWaitTime")
SESSION_ONLY = ("maxConcurrentSessions", "maxConcurrentCallsPerSession", "sessionIdleTimeout")


def _triggers(kind: str) -> list[dict]:
    found = []
    for fn in registered_functions():
        for binding in fn.get_bindings_dict()["bindings"]:
            if binding["type"] == kind:
                found.append(binding)
    return found


def _cardinality(binding: dict) -> str:
    value = binding.get("cardinality", "one")
    return str(getattr(value, "value", value)).lower()


def _docs_host_paragraph() -> str:
    text = (REPO / "docs" / "deploy.md").read_text()
    start = text.index("`host.json` keeps only settings")
    return text[start:text.index("\n## ", start)]


def _leaves(node: dict, prefix: str = "") -> list[str]:
    names = []
    for key, value in node.items():
        if isinstance(value, dict) and key not in ("extensionBundle", "initialOffsetOptions", "logLevel"):
            names += _leaves(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def test_service_bus_batch_and_session_options_are_absent_while_every_trigger_is_single():
    triggers = _triggers("serviceBusTrigger")
    assert triggers
    options = HOST["extensions"]["serviceBus"]
    if all(_cardinality(t) == "one" for t in triggers):
        present = [name for name in SERVICE_BUS_BATCH_ONLY if name in options]
        assert not present, f"{present} apply only to functions that receive a batch"
    if not any(t.get("isSessionsEnabled") for t in triggers):
        assert not [name for name in SESSION_ONLY if name in options]


def test_host_auto_complete_is_absent_when_every_trigger_sets_its_own():
    triggers = _triggers("serviceBusTrigger")
    if all("autoCompleteMessages" in t for t in triggers):
        assert "autoCompleteMessages" not in HOST["extensions"]["serviceBus"]


def test_event_hubs_wait_time_only_with_a_minimum_batch_above_one():
    options = HOST["extensions"]["eventHubs"]
    if "minEventBatchSize" in options:
        assert options["minEventBatchSize"] != 1, "minEventBatchSize 1 is the default"
    if options.get("minEventBatchSize", 1) == 1:
        assert "maxWaitTime" not in options, "maxWaitTime is read only when minEventBatchSize > 1"


def test_event_hubs_batch_size_serves_a_batch_trigger():
    (payments,) = _triggers("eventHubTrigger")
    assert _cardinality(payments) == "many"
    options = HOST["extensions"]["eventHubs"]
    assert options["prefetchCount"] >= options["maxEventBatchSize"]


def test_every_setting_is_explained_in_the_docs():
    paragraph = _docs_host_paragraph()
    for path in _leaves(HOST):
        name = path.rsplit(".", 1)[-1]
        if name == "version":
            continue
        assert re.search(rf"`{re.escape(name)}[`:]", paragraph), \
            f"docs/deploy.md does not explain host.json {path}"
