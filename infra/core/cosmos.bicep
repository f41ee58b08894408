// Azure Cosmos DB for NoSQL account for the `cosmos` dedup backend.
// Containers and partition keys are fixed in the application code:
//  * orders        /orderId  document id = order id, so the document itself is the dedup marker
//  * order-status  /orderId  versioned status, applied as conditional upserts
//  * ledger        /pk       account balances + payment dedup markers (one partition per account,
//                            so marker and balance commit in one transactional batch)
//  * dedup         /pk       generic dedup markers (per consumer + key) and high-water marks
// `defaultTtl: -1` turns per-item TTL on without expiring anything by default: each marker
// carries its own `ttl` (DEDUP_TTL_SECONDS), business documents carry none and never expire.
// Key-based auth is disabled; the app uses its managed identity with the built-in
// "Cosmos DB Built-in Data Contributor" data-plane role, scoped to the database.

@description('Cosmos DB account name (lowercase, 3-44 characters).')
param name string

@description('Region of the account.')
param location string

@description('Tags applied to the account.')
param tags object = {}

@description('Database name (COSMOS_DATABASE).')
param databaseName string

@description('true: serverless (pay per request, default). false: provisioned autoscale throughput shared by the database.')
param serverless bool = true

@description('Autoscale max RU/s of the database when serverless is false.')
@minValue(1000)
param autoscaleMaxThroughput int = 1000

@description('Principal id of the Function App managed identity.')
param appPrincipalId string

@description('Optional developer principal id (same data-plane role as the app). Empty: no assignment.')
param developerPrincipalId string = ''

// Cosmos DB Built-in Data Contributor (data plane role definition id).
var dataContributorRoleId = '00000000-0000-0000-0000-000000000002'

var serverlessCapabilities = [
  {
    name: 'EnableServerless'
  }
]

// Indexing: every item is read and written by id and partition key, which needs no index;
// only the maintenance sweep (the marker fields iV: a marker, iS: in progress, iL: lease
// expiry, iX: expiry; oT for the outbox sweep, present only on markers with pending messages;
// shared/stores/codec.py) and the replay tool's per-partition listing (the partition key
// property) filter on properties. The default
// policy would index every property of every marker, balance and order, and each write pays
// index RUs for them. Same policies as COSMOS_INDEXING in functions/settings.py (tests/infra
// holds the two together and every query the code issues against the included paths).
var orderIdIndexingPolicy = {
  indexingMode: 'consistent'
  automatic: true
  includedPaths: [
    {
      path: '/iV/?'
    }
    {
      path: '/iS/?'
    }
    {
      path: '/iL/?'
    }
    {
      path: '/iX/?'
    }
    {
      path: '/oT/?'
    }
    {
      path: '/orderId/?'
    }
  ]
  excludedPaths: [
    {
      path: '/*'
    }
  ]
}

var pkIndexingPolicy = {
  indexingMode: 'consistent'
  automatic: true
  includedPaths: [
    {
      path: '/iV/?'
    }
    {
      path: '/iS/?'
    }
    {
      path: '/iL/?'
    }
    {
      path: '/iX/?'
    }
    {
      path: '/oT/?'
    }
    {
      path: '/pk/?'
    }
  ]
  excludedPaths: [
    {
      path: '/*'
    }
  ]
}

var provisionedDatabaseOptions = {
  autoscaleSettings: {
    maxThroughput: autoscaleMaxThroughput
  }
}

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' = {
  // checkov:skip=CKV_AZURE_101: the Flex Consumption app of this template has no VNet or private endpoint, so it reaches Cosmos DB publicly; key auth is disabled (disableLocalAuth) and access requires an Entra ID data-plane role.
  name: name
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: 'Session'
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: serverless ? serverlessCapabilities : []
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: 'Enabled'
    enableAutomaticFailover: false
    enableMultipleWriteLocations: false
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-11-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
    options: serverless ? {} : provisionedDatabaseOptions
  }
}

resource ordersContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'orders'
  properties: {
    resource: {
      id: 'orders'
      indexingPolicy: orderIdIndexingPolicy
      partitionKey: {
        paths: [
          '/orderId'
        ]
        kind: 'Hash'
        version: 2
      }
    }
  }
}

resource orderStatusContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'order-status'
  properties: {
    resource: {
      id: 'order-status'
      indexingPolicy: orderIdIndexingPolicy
      partitionKey: {
        paths: [
          '/orderId'
        ]
        kind: 'Hash'
        version: 2
      }
    }
  }
}

resource ledgerContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'ledger'
  properties: {
    resource: {
      id: 'ledger'
      indexingPolicy: pkIndexingPolicy
      partitionKey: {
        paths: [
          '/pk'
        ]
        kind: 'Hash'
        version: 2
      }
      defaultTtl: -1
    }
  }
}

resource dedupContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'dedup'
  properties: {
    resource: {
      id: 'dedup'
      indexingPolicy: pkIndexingPolicy
      partitionKey: {
        paths: [
          '/pk'
        ]
        kind: 'Hash'
        version: 2
      }
      defaultTtl: -1
    }
  }
}

// --- Data-plane role assignments, scoped to the database (not the whole account) -------------
resource appDataContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = {
  parent: account
  name: guid(account.id, databaseName, appPrincipalId, dataContributorRoleId)
  properties: {
    roleDefinitionId: '${account.id}/sqlRoleDefinitions/${dataContributorRoleId}'
    principalId: appPrincipalId
    scope: '${account.id}/dbs/${databaseName}'
  }
  dependsOn: [
    database
  ]
}

resource devDataContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (!empty(developerPrincipalId)) {
  parent: account
  name: guid(account.id, databaseName, developerPrincipalId, dataContributorRoleId)
  properties: {
    roleDefinitionId: '${account.id}/sqlRoleDefinitions/${dataContributorRoleId}'
    principalId: developerPrincipalId
    scope: '${account.id}/dbs/${databaseName}'
  }
  dependsOn: [
    database
  ]
}

output id string = account.id
output name string = account.name
output endpoint string = account.properties.documentEndpoint
output databaseName string = database.name
