// Service Bus namespace (Standard: topics need it) with:
//  * `orders` queue: the reference example. Duplicate detection is on (send-side retries are
//    dropped inside the window); the consumer stays idempotent for everything outside it.
//  * `order-status` queue: status events carrying a version, applied as idempotent upserts.
//  * `notifications` topic with the `notify` and `audit` subscriptions (two independent
//    consumers, each tracking completion on its own).
//  * `balance-changes` queue: payments publishes BalanceChanged there through its outbox;
//    balance_projection reads it (the second hop).
// Every entity shares the same lock duration and max delivery count, because the app's dedup
// retention (DEDUP_TTL_SECONDS) is derived from exactly these two values.
// Local (SAS) auth is disabled; the app receives with its managed identity. Role assignments are
// scoped to the individual entities the triggers read (topic triggers need scope over the
// subscription resource), never to the namespace.

@description('Service Bus namespace name.')
param name string

@description('Region of the namespace.')
param location string

@description('Tags applied to the namespace.')
param tags object = {}

@description('Queue carrying new orders (MessageId = order id).')
param ordersQueueName string

@description('Queue carrying order status changes.')
param orderStatusQueueName string

@description('Topic carrying notification requests.')
param notificationsTopicName string

@description('Subscription of the notification sender.')
param notifySubscriptionName string

@description('Subscription of the audit consumer.')
param auditSubscriptionName string

@description('Queue carrying BalanceChanged (payments publishes, balance_projection reads).')
param balanceChangesQueueName string

@description('Peek-lock duration in seconds (Service Bus allows 5..300). The same value feeds SERVICEBUS_LOCK_DURATION_SECONDS.')
@minValue(5)
@maxValue(300)
param lockDurationSeconds int

@description('Deliveries before a message is dead-lettered. The same value feeds SERVICEBUS_MAX_DELIVERY_COUNT.')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int

@description('Duplicate detection history window (ISO 8601, 20 seconds to 7 days).')
param duplicateDetectionHistoryTimeWindow string

@description('Default message time to live (ISO 8601). Expired messages are dead-lettered, not dropped.')
param defaultMessageTimeToLive string

@description('Duplicate-detection window of the outbox destinations, in seconds (the app checks it against the redelivery window at startup).')
param outboxDuplicateDetectionSeconds int

@description('Principal id of the Function App managed identity (receives only).')
param appPrincipalId string

@description('Optional developer principal id: receives like the app and may also send test messages. Empty: no assignment.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param developerPrincipalType string = 'User'

var lockDuration = 'PT${lockDurationSeconds}S'

var roles = {
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataOwner: '090c5cfd-751d-490a-894a-3ce6f1109419'
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource ordersQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: ordersQueueName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
    enablePartitioning: false
  }
}

resource orderStatusQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: orderStatusQueueName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
    enablePartitioning: false
  }
}

// An outbox destination: payments publishes BalanceChanged here after each account's commit,
// and re-sends (same MessageId) while a batch is retried or replayed; the window is the
// outbox's, like the topic's. balance_projection reads it: the delivery settings of a trigger
// entity.
resource balanceChangesQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: balanceChangesQueueName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${outboxDuplicateDetectionSeconds}S'
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
    enablePartitioning: false
  }
}

// Data Sender (payments' outbox) and Data Owner (balance_projection's trigger: the Manage claim
// target-based scaling needs, see below) on this queue alone. The sender grant states the
// outbox rule on its own: it holds if the consumer moves to another app.
resource appBalanceChangesDataSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(balanceChangesQueue.id, appPrincipalId, roles.serviceBusDataSender)
  scope: balanceChangesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appBalanceChangesDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(balanceChangesQueue.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: balanceChangesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The outbox destination: orders publishes OrderAccepted here after its commit, and re-sends
// (same MessageId) while its redeliveries can come; the window covers that horizon.
resource notificationsTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = {
  parent: namespace
  name: notificationsTopicName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${outboxDuplicateDetectionSeconds}S'
    defaultMessageTimeToLive: defaultMessageTimeToLive
    enablePartitioning: false
  }
}

resource notifySubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = {
  parent: notificationsTopic
  name: notifySubscriptionName
  properties: {
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    deadLetteringOnFilterEvaluationExceptions: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
  }
}

resource auditSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = {
  parent: notificationsTopic
  name: auditSubscriptionName
  properties: {
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    deadLetteringOnFilterEvaluationExceptions: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
  }
}

// --- Role assignments (app identity): Data Owner on each trigger entity, nothing else ----------
// Receive, complete, abandon and dead-letter are receiver-side operations (Data Receiver would do).
// Target-based scaling is what needs more: the scale controller runs as the app's identity and
// reads the entity's runtime properties (active message count) through the Service Bus
// administration API, which requires the Manage claim. Without it, GetQueueRuntimeProperties /
// GetSubscriptionRuntimeProperties fail with UnauthorizedAccessException and the trigger falls
// back to incremental scaling (one instance at a time, guessed from the first message's age).
// The only built-in role carrying Manage is Azure Service Bus Data Owner, and a custom role would
// not be narrower (the Manage claim itself allows entity management). So: Data Owner, scoped to
// exactly the five entities the triggers read; no role on the namespace or any other entity.
// Data Sender only on the outbox destinations (the notifications topic: orders publishes there;
// the balance-changes queue, above: payments does), see infra/README.md, "Role assignments".
resource appNotificationsDataSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(notificationsTopic.id, appPrincipalId, roles.serviceBusDataSender)
  scope: notificationsTopic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appOrdersDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(ordersQueue.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: ordersQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appOrderStatusDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(orderStatusQueue.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: orderStatusQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appNotifyDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(notifySubscription.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: notifySubscription
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appAuditDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(auditSubscription.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: auditSubscription
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// --- Role assignments (optional developer) ---------------------------------------------------
// Namespace scope: a developer running `func start` against Azure receives from every entity and
// sends test traffic (the tools/ producers) to the queues and the topic.
resource devReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(namespace.id, developerPrincipalId, roles.serviceBusDataReceiver)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

resource devSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(namespace.id, developerPrincipalId, roles.serviceBusDataSender)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

output id string = namespace.id
output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output ordersQueueName string = ordersQueue.name
output orderStatusQueueName string = orderStatusQueue.name
output notificationsTopicName string = notificationsTopic.name
output balanceChangesQueueName string = balanceChangesQueue.name
