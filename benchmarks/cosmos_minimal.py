"""Client CPU of the payments transaction on Cosmos DB, with and without `Prefer: return=minimal`.

    .venv/bin/python -m benchmarks.cosmos_minimal [--transactions 400] [--markers 5] [--rounds 7]

The transaction the payments consumer commits per account (a few markers, then the balance
replaced under its etag), sent through the store and the sync SDK exactly as the app sends it,
against answers recorded from the local Cosmos server once and then replayed in process: the
replay transport hands the SDK each answer's status, headers and body without a socket. `full`
replays the answer as the server sent it (every item echoed: what the SDK gets without the
header); `minimal` asks for `return=minimal` and replays the answer the service gives then (no
`resourceBody`; the local server itself ignores the header). The two differ only in the header
and in the echoed items, so the difference is the client CPU the echo costs: the SDK decoding
it, and what the pipeline does with the larger body. TLS and socket reads of the echoed bytes
are not in it (they add to it). Rounds alternate; the minimum round is reported (the least
disturbed on a shared machine), with the median beside it.

Instructions instead of time (callgrind; the difference of two counts is the commits'):

    .venv/bin/python -m benchmarks.cosmos_minimal --save-answers /tmp/answers.json
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python -m \
        benchmarks.cosmos_minimal --answers /tmp/answers.json --only minimal --transactions 100
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import requests
from azure.core.pipeline.transport import HttpTransport, RequestsTransport, RequestsTransportResponse
from azure.cosmos import CosmosClient, PartitionKey

from shared._backends.cosmos import CosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.keys import DedupKey, request_hash
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import WriteOp

Answer = tuple[int, dict[str, str], bytes]  # status, headers, body
_BATCH_HEADER = "x-ms-cosmos-is-batch-request"


def route(request: Any) -> str:
    """What a request is, for replaying an answer to it: its method and its path with the
    names in it (database, container, item) left out."""
    if request.headers.get(_BATCH_HEADER, "").lower() == "true":
        return "batch"
    parts = request.url.split("?")[0].split("/", 3)[-1].strip("/").split("/")
    kinds = [part for i, part in enumerate(parts) if i % 2 == 0]  # dbs, colls, docs, ...
    return f"{request.method} {'/'.join(kinds)}"


class Recording(RequestsTransport):
    """A requests transport that keeps the last answer to each route."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answers: dict[str, Answer] = {}

    def send(self, request: Any, **kwargs: Any) -> Any:
        response = super().send(request, **kwargs)
        self.answers[route(request)] = (response.status_code, dict(response.headers),
                                        response.internal_response.content)
        return response


class Replay(HttpTransport):
    """Answers each request with the recorded answer to its route, in process."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers

    def send(self, request: Any, **kwargs: Any) -> Any:
        status, headers, body = self.answers[route(request)]
        raw = requests.Response()
        raw.status_code, raw._content = status, body  # a built response: its body as recorded
        raw.headers.update(headers)
        raw.url = request.url
        return RequestsTransportResponse(request, raw)

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *args: Any) -> None:
        pass


def minimal(answer: Answer) -> Answer:
    """A batch answer as the service gives it to `Prefer: return=minimal`: no resourceBody."""
    status, headers, body = answer
    results = json.loads(body)
    for result in results:
        result.pop("resourceBody", None)
    stripped = json.dumps(results, separators=(",", ":")).encode()
    return status, {**headers, "Content-Length": str(len(stripped))}, stripped


def transaction(run: str, n: int, markers: int, balance_etag: str) -> tuple[IdempotencyRecord, list[WriteOp]]:
    """One account's transaction of a payments batch: `markers` markers, the balance replaced."""
    now = time.time()
    records = [IdempotencyRecord(
        DedupKey.from_cloudevent("payments", "/bench/payments", f"pay-{run}-{n}-{i}"),
        RecordState.COMPLETED, request_hash({"accountId": "acct-1", "amountCents": 5, "n": i}),
        now, now, expires_at=now + 604_800, result={"balanceCents": 5 * (i + 1)},
        partition="acct-1") for i in range(markers)]
    balance = WriteOp("replace", "balance", {"kind": "account", "accountId": "acct-1",
                                             "balanceCents": 5 * markers, "version": n},
                      balance_etag)
    return records[0], [*(WriteOp.marker(r) for r in records[1:]), balance]


def record_answers(markers: int) -> dict[str, Answer]:
    """Two transactions against the local server (the balance created, then replaced): the
    answers to replay."""
    from local_stack import COSMOS_LOCAL_KEY, LocalStack

    with LocalStack() as stack:
        transport = Recording()
        client = CosmosClient(stack.cosmos_endpoint, COSMOS_LOCAL_KEY, connection_verify=False,
                              transport=transport, enable_endpoint_discovery=False)
        database = client.create_database_if_not_exists(f"bench{uuid.uuid4().hex[:8]}")
        database.create_container("ledger", PartitionKey("/pk"), default_ttl=-1,
                                  indexing_policy=record_indexing_policy("/pk"))
        container = database.get_container_client("ledger")
        container.read()  # what a new client asks first (its answer replayed too)
        store = CosmosIdempotencyStore.from_container(container, "/pk", minimal_responses=False)
        store.write_documents("acct-1", [WriteOp("create", "balance", {"balanceCents": 0})])
        balance = store.read_document("acct-1", "balance")
        assert balance is not None and balance.etag is not None  # just written
        first, operations = transaction("record", 0, markers, balance.etag)
        store.commit(first, operations)
        client.close()
        return dict(transport.answers)


@dataclass(frozen=True)
class MinimalCost:
    transactions: int
    markers: int
    rounds: int
    full_us: float  # per marker, minimum round
    minimal_us: float
    full_median_us: float
    minimal_median_us: float
    echoed_bytes: int  # per transaction: the answer's body, full and minimal
    minimal_bytes: int

    def note(self) -> str:
        return (f"Client CPU per marker of a {self.markers}-marker transaction + balance replace "
                f"({self.transactions} transactions, best of {self.rounds} rounds): "
                f"{self.full_us:.1f} µs with the items echoed, {self.minimal_us:.1f} µs with "
                f"Prefer: return=minimal ({self.full_us - self.minimal_us:.1f} µs saved; medians "
                f"{self.full_median_us:.1f} / {self.minimal_median_us:.1f} µs); the answer's body "
                f"{self.echoed_bytes} B echoed, {self.minimal_bytes} B minimal.")


def replay_stores(answers: dict[str, Answer]) -> dict[str, CosmosIdempotencyStore]:
    """A store per variant on its replayed answers: "full" (echoed) and "minimal"."""
    replays = {"full": answers, "minimal": {**answers, "batch": minimal(answers["batch"])}}
    stores = {}
    for name, replayed in replays.items():
        client = CosmosClient("https://127.0.0.1:1/", "a2V5", transport=Replay(replayed),
                              enable_endpoint_discovery=False)
        container = client.get_database_client("bench").get_container_client("ledger")
        stores[name] = CosmosIdempotencyStore.from_container(
            container, "/pk", minimal_responses=name == "minimal")
    return stores


def commit_only(answers: dict[str, Answer], variant: str, transactions: int, markers: int) -> None:
    """`transactions` commits of one variant and nothing else (run under callgrind twice, with
    two counts: the difference of the totals is the instructions of the commits)."""
    store = replay_stores(answers)[variant]
    store.commit(*transaction("warm", 0, markers, '"etag"')[:2])  # first use: caches filled
    for first, operations in [transaction(f"only{variant}", n, markers, '"etag"')
                              for n in range(transactions)]:
        store.commit(first, operations)


def measure(transactions: int = 400, markers: int = 5, rounds: int = 7) -> MinimalCost:
    answers = record_answers(markers)
    stores = replay_stores(answers)
    replays = {"full": answers, "minimal": {**answers, "batch": minimal(answers["batch"])}}
    run = uuid.uuid4().hex[:6]
    times: dict[str, list[float]] = {"full": [], "minimal": []}
    for r in range(rounds + 1):  # the first round warms both up and is not counted
        for name in ("full", "minimal") if r % 2 else ("minimal", "full"):
            built = [transaction(f"{run}{r}{name}", n, markers, '"etag"') for n in range(transactions)]
            store = stores[name]
            started = time.process_time()
            for first, operations in built:
                store.commit(first, operations)
            if r:
                times[name].append((time.process_time() - started) / (transactions * markers) * 1e6)
    return MinimalCost(transactions, markers, rounds, min(times["full"]), min(times["minimal"]),
                       statistics.median(times["full"]), statistics.median(times["minimal"]),
                       len(answers["batch"][2]), len(replays["minimal"]["batch"][2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--transactions", type=int, default=400)
    parser.add_argument("--markers", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--save-answers", default=None,
                        help="record the answers from the local server into this file and stop")
    parser.add_argument("--only", default=None, choices=("full", "minimal"),
                        help="with --answers: just commit, one variant (for callgrind)")
    parser.add_argument("--answers", default=None, help="answers saved by --save-answers")
    args = parser.parse_args(argv)
    logging.getLogger("azure").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if args.save_answers:
        answers = record_answers(args.markers)
        with open(args.save_answers, "w", encoding="utf-8") as file:
            json.dump({name: [status, headers, body.decode("utf-8")]
                       for name, (status, headers, body) in answers.items()}, file)
        return 0
    if args.only:
        with open(args.answers, encoding="utf-8") as file:
            saved = json.load(file)
        commit_only({name: (status, headers, body.encode("utf-8"))
                     for name, (status, headers, body) in saved.items()},
                    args.only, args.transactions, args.markers)
        return 0
    print(measure(args.transactions, args.markers, args.rounds).note())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
