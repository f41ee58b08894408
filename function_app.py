"""The function app: registers each consumer's blueprint (Python v2 programming model).

Startup validates settings (including the dedup retention rule) and enables
telemetry export when Application Insights is configured.
"""

from __future__ import annotations

import azure.functions as func

from functions import http_payments, maintenance, notifications, order_status, orders, payments

app = func.FunctionApp()

for blueprint in (orders.bp, order_status.bp, notifications.bp, payments.bp, http_payments.bp,
                  maintenance.bp):
    app.register_functions(blueprint)
