"""The function app: registers each consumer's blueprint (Python v2 programming model).

Importing it validates every setting (including the dedup retention rule and
the lease/lock rule): a bad value fails indexing with a message naming it,
instead of failing each invocation later. Not gated on FUNCTIONS_WORKER_RUNTIME:
Flex Consumption does not set it, and after a Flex specialization the worker
keeps only the variables the host passes. Telemetry goes to Application
Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set, through the app's
one OpenTelemetry exporter (host.json telemetryMode OpenTelemetry; see
infra/README.md, "Telemetry: one export path").
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions import (
    balance_projection,
    http_payments,
    maintenance,
    notifications,
    order_audit,
    order_status,
    orders,
    payments,
)
from functions.settings import Settings
from shared import configure_observability  # the app's one telemetry export

_settings = Settings.from_env()
# Log records are for what a person acts on (conflicts, parkings, stale claims, one summary per
# Event Hubs batch); per-message counts and latencies are metrics (shared/_core/telemetry.py). The
# app's loggers pass INFO whatever level the worker leaves on the root logger; processed
# messages and duplicates are DEBUG (duplicates INFO with DEDUP_LOG_DUPLICATES=true). The Azure
# SDKs' loggers stay at WARNING: the worker sets the root logger to INFO, and their HTTP logging
# policy writes two INFO records per store request, each exported to Application Insights.
for _package in ("shared", "domain", "functions"):
    logging.getLogger(_package).setLevel(logging.INFO)
logging.getLogger("azure").setLevel(logging.WARNING)
configure_observability(sampling_ratio=_settings.trace_sampling_ratio)

app = func.FunctionApp()

for blueprint in (orders.bp, order_status.bp, notifications.bp, payments.bp, balance_projection.bp,
                  http_payments.bp, maintenance.bp, order_audit.bp):
    app.register_functions(blueprint)

