"""POST /api/payments with an Idempotency-Key header: each payment created once per caller and
key; a retry gets the stored response. Settings: STORAGE_CONNECTION (a connection string, local
runs) or STORAGE_TABLE_ENDPOINT (identity); with COSMOS_ENDPOINT the keys live in Cosmos DB."""

import os
import uuid
from typing import Any

import azure.functions as func
from azure.data.tables import TableClient
from azure.identity import DefaultAzureCredential

from shared import (
    CosmosIdempotencyStore,
    HttpResult,
    Idempotency,
    IdempotencyKeyEndpoint,
    IdempotentRequest,
    PoisonMessageError,
    TableIdempotencyStore,
)

storage = os.environ.get("STORAGE_CONNECTION")
credential = DefaultAzureCredential()
if os.environ.get("COSMOS_ENDPOINT"):
    keys = CosmosIdempotencyStore(os.environ["COSMOS_ENDPOINT"],
                                  os.environ.get("COSMOS_KEY") or credential, database="shop",
                                  container="keys",
                                  connection_verify=os.environ.get("COSMOS_VERIFY_TLS") != "false")
elif storage:
    keys = TableIdempotencyStore.from_connection_string(storage, table_name="keys")
else:
    keys = TableIdempotencyStore(os.environ["STORAGE_TABLE_ENDPOINT"], credential, table_name="keys")
payments = (TableClient.from_connection_string(storage, "payments") if storage else
            TableClient(os.environ["STORAGE_TABLE_ENDPOINT"], "payments", credential=credential))
endpoint = IdempotencyKeyEndpoint(Idempotency(keys), name="payments-api")
app = func.FunctionApp()


def create(request: IdempotentRequest[dict[str, Any]]) -> HttpResult:
    """The payment, under an id derived from the caller's key: a re-run writes the same entity."""
    cents = request.body.get("amountCents")
    if not isinstance(cents, int) or isinstance(cents, bool) or cents <= 0:
        raise PoisonMessageError("InvalidAmount", "amountCents must be a positive integer")
    payment_id = str(uuid.uuid5(uuid.NAMESPACE_URL, request.scoped_key))
    payments.upsert_entity({"PartitionKey": "payments", "RowKey": payment_id, "cents": cents})
    return HttpResult(201, {"paymentId": payment_id, "amountCents": cents})


@app.route(route="payments", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def create_payment(req: func.HttpRequest) -> func.HttpResponse:
    return endpoint.handle(req, create)
