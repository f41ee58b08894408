// Storage account used three ways:
//  * AzureWebJobsStorage of the Functions host (blob leases, timer schedule state, Event Hubs
//    checkpoints and partition ownership), reached by identity;
//  * the Flex Consumption deployment package container;
//  * Table Storage for the `table` dedup backend (dedup markers, parked events, ledger, orders,
//    order status).
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

// --- Role assignments (app identity) -------------------------------------------------------
// Blob Data Owner on the account: the host creates its own containers (azure-webjobs-hosts,
// azure-webjobs-eventhub) for leases, timer state and Event Hubs checkpoints, and reads the
// deployment package. Queue Data Contributor is NOT granted: it is only needed for blob
// triggers, which this app does not use.
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

output id string = storage.id
output name string = storage.name
output blobEndpoint string = 'https://${storage.name}.blob.${environment().suffixes.storage}'
output tableEndpoint string = 'https://${storage.name}.table.${environment().suffixes.storage}'
output deploymentContainerUrl string = 'https://${storage.name}.blob.${environment().suffixes.storage}/${deploymentContainer.name}'
output tableNames array = tableNames
