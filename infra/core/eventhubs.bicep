// Event Hubs namespace (Standard: a consumer group other than $Default needs it) with the
// `payments` hub and the dedicated `payments-processor` consumer group read by the app.
// Events are retained 7 days by default (the Standard maximum), so a consumer that is down over a
// weekend resumes from its checkpoint instead of losing payments.
// The trigger checkpoints into AzureWebJobsStorage (blob), so replays after a restart or a
// partition rebalance are expected; the payment handler deduplicates them.
// Local (SAS) auth is disabled; the app receives with its managed identity, scoped to the hub.

@description('Event Hubs namespace name.')
param name string

@description('Region of the namespace.')
param location string

@description('Tags applied to the namespace.')
param tags object = {}

@description('Event hub carrying payment events.')
param paymentsHubName string

@description('Consumer group used by the payments processor.')
param paymentsConsumerGroupName string

@description('Partitions of the payments hub (fixed after creation on Standard).')
@minValue(1)
@maxValue(32)
param partitionCount int = 4

@description('Event retention in days (Standard: 1..7). Seven days let a consumer that was down over a weekend catch up from its checkpoint.')
@minValue(1)
@maxValue(7)
param messageRetentionInDays int = 7

@description('Principal id of the Function App managed identity (receives only).')
param appPrincipalId string

@description('Optional developer principal id: receives like the app and may also send test events. Empty: no assignment.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param developerPrincipalType string = 'User'

var roles = {
  eventHubsDataReceiver: 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde'
  eventHubsDataSender: '2b629674-e913-4c01-ae53-ef4638d8f975'
}

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
    capacity: 1
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
    isAutoInflateEnabled: false
  }
}

resource paymentsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: paymentsHubName
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: messageRetentionInDays
  }
}

resource paymentsConsumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = {
  parent: paymentsHub
  name: paymentsConsumerGroupName
  properties: {
    userMetadata: 'Idempotent payments processor (Azure Functions Event Hubs trigger).'
  }
}

// --- Role assignments (app identity): Data Receiver on the hub only -------------------------
resource appPaymentsReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(paymentsHub.id, appPrincipalId, roles.eventHubsDataReceiver)
  scope: paymentsHub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// --- Role assignments (optional developer) ---------------------------------------------------
resource devPaymentsReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(paymentsHub.id, developerPrincipalId, roles.eventHubsDataReceiver)
  scope: paymentsHub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataReceiver)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

resource devPaymentsSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(paymentsHub.id, developerPrincipalId, roles.eventHubsDataSender)
  scope: paymentsHub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataSender)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

output id string = namespace.id
output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output paymentsHubName string = paymentsHub.name
output paymentsConsumerGroupName string = paymentsConsumerGroup.name
