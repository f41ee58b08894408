// Storage account used four ways:
//  * AzureWebJobsStorage of the Functions host (blob leases, timer schedule state, Event Hubs
//    checkpoints and partition ownership), reached by identity;
//  * the Flex Consumption deployment package container;
//  * Table Storage for the `table` dedup backend (dedup markers, parked events, ledger, orders,
//    order status);
//  * the order-audit Storage queue (the `order_audit` trigger) and its `-poison` queue.
// Shared keys are disabled: every client uses Microsoft Entra ID. Role assignments for the app
// identity (and, optionally, a developer) are declared here, next to the account they grant.

@description('Storage account name (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param name string

@description('Region of the account.')
param location string

@description('Tags applied to the account.')
param tags object = {}

@description('Blob container holding the Flex Consumption deployment package.')
param deploymentContainerName string

@description('Principal id of the Function App managed identity.')
param appPrincipalId string

@description('Optional principal id of a developer who runs the app locally against Azure. Empty: no assignment.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param developerPrincipalType string = 'User'

@description('ORDER_AUDIT_QUEUE_NAME: the queue the order_audit trigger reads. Its poison queue is `<name>-poison`, as the Functions host names it (at most 56 characters, so that one is a queue name too).')
@minLength(3)
@maxLength(56)
param auditQueueName string

// The host moves a message it gave up on to `<queue>-poison`; the app's consumer writes its
// refusals there too. Declared here so the app's role can be scoped to exactly these two.
var auditPoisonQueueName = '${auditQueueName}-poison'

// Table names are fixed in the application code (shared/ table backend).
var tableNames = [
  'dedup'
  'parked'
  'ledger'
  'orders'
  'orderstatus'
]

// Built-in role definition ids.
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: the Flex Consumption app of this template has no VNet integration, so the firewall cannot default to Deny; instead shared keys are disabled and every caller needs an Entra ID role assignment.
  // checkov:skip=CKV_AZURE_59: public endpoint kept for the same reason (no VNet or private endpoints in this template); access is identity-only (allowSharedKeyAccess false, no anonymous blob access).
  // checkov:skip=CKV_AZURE_206: locally redundant storage is enough for host state and the reference dedup tables; choose ZRS/GZRS (sku) for production data.
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: false
      services: {
        blob: {
          enabled: true
        }
        table: {
          enabled: true
        }
        queue: {
          enabled: true
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for tableName in tableNames: {
  parent: tableService
  name: tableName
}]

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource auditQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: auditQueueName
}

resource auditPoisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: auditPoisonQueueName
}

// --- Role assignments (app identity) -------------------------------------------------------
// Blob Data Owner on the account: the host creates its own containers (azure-webjobs-hosts,
// azure-webjobs-eventhub) for leases, timer state and Event Hubs checkpoints, and reads the
// deployment package. Queue Data Contributor is NOT granted on the account (only blob triggers
// would need it there): the app holds it on the two order-audit queues alone, below.
resource appBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Table Data Contributor on the account: the table dedup backend reads/writes the five tables,
// and the host writes its diagnostic events table.
resource appTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Queue Data Contributor on the order-audit queue and its poison queue only. The queue trigger
// receives, deletes and updates messages (the host renews a running message's visibility and
// releases a failed one with Update Message, which needs messages/write: Message Processor
// lacks it); the host copies given-up messages to the poison queue and the app writes its
// refusals there (send). Accepted cost: the role also lets the identity delete those two queues.
resource appAuditQueueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(auditQueue.id, appPrincipalId, roles.storageQueueDataContributor)
  scope: auditQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appAuditPoisonQueueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(auditPoisonQueue.id, appPrincipalId, roles.storageQueueDataContributor)
  scope: auditPoisonQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// --- Role assignments (optional developer) -------------------------------------------------
resource devBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(storage.id, developerPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

resource devTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(storage.id, developerPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

// A developer sends test traffic to the order-audit queue and reads its poison queue.
resource devAuditQueueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(auditQueue.id, developerPrincipalId, roles.storageQueueDataContributor)
  scope: auditQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

resource devAuditPoisonQueueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(auditPoisonQueue.id, developerPrincipalId, roles.storageQueueDataContributor)
  scope: auditPoisonQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

output id string = storage.id
output name string = storage.name
output blobEndpoint string = 'https://${storage.name}.blob.${environment().suffixes.storage}'
output tableEndpoint string = 'https://${storage.name}.table.${environment().suffixes.storage}'
output queueEndpoint string = 'https://${storage.name}.queue.${environment().suffixes.storage}'
output deploymentContainerUrl string = 'https://${storage.name}.blob.${environment().suffixes.storage}/${deploymentContainer.name}'
output tableNames array = tableNames
output auditQueueName string = auditQueue.name
output auditPoisonQueueName string = auditPoisonQueue.name
