#!/usr/bin/env node
/*
 * Test-stack compatibility layer for @vercel/cosmosdb-server 1.0.1.
 *
 * The server is a third-party Cosmos DB for NoSQL implementation. Two of its
 * gaps make correct client code fail, so this launcher swaps two handlers in
 * `require.cache` before the server loads its routes:
 *
 *  1. Transactional batch: the original does not roll back the operations that
 *     ran before a failing one (real Cosmos DB does). The wrapper snapshots the
 *     collection's document maps, runs the original, and restores the snapshot
 *     when any operation failed, reporting 424 for the operations that had
 *     succeeded. An exception inside the original is rolled back the same way.
 *     Operations without their own `partitionKey` (the Python SDK sends it
 *     once, as the batch's header) get the header's value, so a replace with
 *     an `ifMatch` etag answers 412 instead of failing the whole request.
 *  2. Point read of a missing document in a container partitioned on a field
 *     throws a TypeError (HTTP 500); the wrapper answers 404 as Cosmos DB does.
 *
 * Gap 3 (items never expire by `ttl`) is left alone: the client checks expiry.
 * The server is also started with keep-alive on (it answers `Connection: close`
 * by default, which costs a TLS handshake per request).
 *
 * `--advertise-port N` makes the account advertise port N as its endpoint (the
 * SDK follows the advertised endpoint after its first request): a relay on N,
 * in front of this server, then carries every request, so stopping the relay
 * is a network outage the client meets.
 *
 * Usage: node tools/cosmos-server/launch.js [--port 8081] [--host 127.0.0.1]
 *                                           [--advertise-port N]
 */
"use strict";

const path = require("path");
const { Readable } = require("stream");

const serverRoot = path.dirname(require.resolve("@vercel/cosmosdb-server/package.json"));
const rawBody = require(require.resolve("raw-body", { paths: [serverRoot] }));
const handlerPath = (name) => path.join(serverRoot, "lib", "handler", `${name}.js`);

function replaceModule(file, wrap) {
  const original = require(file);
  const patched = { ...original, default: wrap(original.default) };
  Object.defineProperty(patched, "__esModule", { value: true });
  require.cache[file].exports = patched;
}

function snapshot(documents) {
  return {
    data: new Map(documents._data),
    index: new Map(documents._index),
    ridCount: documents._ridCount,
  };
}

function restore(documents, snap) {
  documents._data = snap.data;
  documents._index = snap.index;
  documents._ridCount = snap.ridCount;
}

async function withOperationPartitionKeys(req) {
  const operations = JSON.parse((await rawBody(req)).toString());
  const header = req.headers["x-ms-documentdb-partitionkey"];
  if (Array.isArray(operations) && header !== undefined) {
    for (const op of operations) {
      if (op && op.partitionKey === undefined) op.partitionKey = header;
    }
  }
  const replay = Readable.from([Buffer.from(JSON.stringify(operations))]);
  replay.headers = req.headers;
  return replay;
}

function atomicBatch(original) {
  return async (account, req, res, params) => {
    req = await withOperationPartitionKeys(req);
    const collection = account.database(params.dbId).collection(params.collId);
    const documents = collection.read() ? collection.documents : null;
    const snap = documents ? snapshot(documents) : null;
    let results;
    try {
      results = await original(account, req, res, params);
    } catch (error) {
      if (snap) restore(documents, snap);
      res.statusCode = 400;
      return { code: "BadRequest", message: `batch rolled back: ${error.message}` };
    }
    if (!snap || !Array.isArray(results)) return results;
    const failed = results.some((r) => r.statusCode >= 400);
    if (!failed) return results;
    restore(documents, snap);
    return results.map((r) =>
      r.statusCode >= 400 ? r : { statusCode: 424, requestCharge: 0 }
    );
  };
}

function notFoundOnMissing(original) {
  return (account, req, res, params) => {
    try {
      return original(account, req, res, params);
    } catch (error) {
      if (!(error instanceof TypeError)) throw error;
      res.statusCode = 404;
      return {
        code: "NotFound",
        message: "Entity with the specified id does not exist in the system.",
      };
    }
  };
}

function install() {
  replaceModule(handlerPath("batch-documents"), atomicBatch);
  replaceModule(handlerPath("read-document"), notFoundOnMissing);
}

function parseArgs(argv) {
  const args = { port: 8081, host: "127.0.0.1" };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === "--port" || argv[i] === "-p") args.port = parseInt(argv[(i += 1)], 10);
    else if (argv[i] === "--host") args.host = argv[(i += 1)];
    else if (argv[i] === "--advertise-port") args.advertisePort = parseInt(argv[(i += 1)], 10);
  }
  return args;
}

function main() {
  install();
  // Loaded only after the handlers are replaced, so its routes see the wrappers.
  const { createHttpsServer } = require("@vercel/cosmosdb-server");
  const { port, host, advertisePort } = parseArgs(process.argv.slice(2));
  // Keep-alive: the default answers "Connection: close", a TLS handshake per request.
  const server = createHttpsServer({ keepAlive: true });
  const address = server.address.bind(server);
  if (advertisePort) {
    // The server builds its account from server.address() once it listens.
    server.address = () => ({ ...address(), port: advertisePort });
  }
  server.listen(port, host, () => {
    console.log(`Ready to accept HTTPS connections at ${host}:${address().port}`);
  });
  const stop = () => server.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

module.exports = { install, atomicBatch, notFoundOnMissing };

if (require.main === module) main();
