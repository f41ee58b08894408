// Every resource of the idempotent consumer app, deployed into one resource group.
// Entry points: main.bicep (subscription scope: creates the group, used by `azd up` and
// `az deployment sub create`) or this file directly with `az deployment group create`.
//
// The settings contract: `appSettings` below defines every setting the app reads in Azure.
// Identity-based connections only: no keys, no connection strings.

targetScope = 'resourceGroup'

@minLength(1)
@maxLength(64)
@description('Environment name; seeds the unique resource-name suffix.')
param environmentName string

@description('Region of every resource (must offer Flex Consumption).')
param location string = resourceGroup().location

@description('Tags applied to every resource.')
param tags object = {}

@description('Optional object id of a developer (or CI principal) that runs the app locally against these resources. Empty: no developer role assignments.')
param principalId string = ''

@description('Principal type of principalId.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param principalType string = 'User'

// --- Entity names (the app reads them as %NAME% binding expressions) --------------------------
@description('ORDERS_QUEUE_NAME')
param ordersQueueName string = 'orders'

@description('ORDER_STATUS_QUEUE_NAME')
param orderStatusQueueName string = 'order-status'

@description('NOTIFICATIONS_TOPIC_NAME')
param notificationsTopicName string = 'notifications'

@description('NOTIFY_SUBSCRIPTION_NAME')
param notifySubscriptionName string = 'notify'

@description('AUDIT_SUBSCRIPTION_NAME')
param auditSubscriptionName string = 'audit'

@description('BALANCE_CHANGES_QUEUE')
param balanceChangesQueueName string = 'balance-changes'

@description('ORDER_AUDIT_QUEUE_NAME: the Storage queue the order_audit trigger reads (its poison queue is `<name>-poison`).')
param orderAuditQueueName string = 'order-audit'

@description('PAYMENTS_HUB_NAME')
param paymentsHubName string = 'payments'

@description('PAYMENTS_CONSUMER_GROUP')
param paymentsConsumerGroupName string = 'payments-processor'

@description('COSMOS_DATABASE')
param cosmosDatabaseName string = 'idempotency'

// --- Delivery and retention (the retention rule is derived from these) ------------------------
@description('Service Bus peek-lock duration in seconds. Sets the entities\' lockDuration AND SERVICEBUS_LOCK_DURATION_SECONDS.')
@minValue(5)
@maxValue(300)
param serviceBusLockDurationSeconds int = 60

@description('Service Bus max delivery count. Sets the entities\' maxDeliveryCount AND SERVICEBUS_MAX_DELIVERY_COUNT.')
@minValue(1)
@maxValue(2000)
param serviceBusMaxDeliveryCount int = 10

@description('Longest time the Functions host keeps renewing a lock, in seconds. Overrides host.json maxAutoLockRenewalDuration and sets SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS.')
@minValue(0)
@maxValue(86399)
param serviceBusMaxAutoLockRenewalSeconds int = 300

@description('Extra dedup retention beyond the last possible redelivery, in seconds (covers late dead-letter resubmissions).')
@minValue(0)
param dedupRetentionMarginSeconds int = 86400

@description('Service Bus duplicate detection history window (ISO 8601, PT20S..P7D).')
param duplicateDetectionHistoryTimeWindow string = 'PT10M'

@description('Default message time to live on the queues and the topic (ISO 8601).')
param defaultMessageTimeToLive string = 'P14D'

@description('Storage queue deliveries before the Functions host moves a message to `<queue>-poison`. Overrides host.json extensions.queues.maxDequeueCount AND sets QUEUE_MAX_DEQUEUE_COUNT (the app poisons with its reason on that delivery).')
@minValue(1)
@maxValue(100)
param queueMaxDequeueCount int = 5

@description('Seconds before a Storage queue message whose function failed is visible again. Overrides host.json extensions.queues.visibilityTimeout (default 0: at once), so maxDequeueCount deliveries span a short store outage instead of a few milliseconds.')
@minValue(0)
@maxValue(3599)
param queueVisibilityTimeoutSeconds int = 30

@description('DEDUP_LEASE_SECONDS: how long an in-progress marker blocks other consumers before it is considered stale. Shorter than the lock (the app refuses otherwise) and renewed while the handler runs.')
@minValue(1)
param dedupLeaseSeconds int = 54

// --- Behaviour -----------------------------------------------------------------------------
@description('DEDUP_BACKEND: which store holds dedup markers and business records.')
@allowed([
  'cosmos'
  'table'
])
param dedupBackend string = 'cosmos'

@description('NOTIFICATION_API_URL: downstream notification API called by the notify and audit consumers. Required: an empty URL would fail every delivery until the messages are dead-lettered.')
@minLength(1)
param notificationApiUrl string

@description('NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY: whether that API deduplicates on the Idempotency-Key header.')
param notificationApiHonoursIdempotencyKey bool = false

@description('PAYMENTS_MISSING_KEY_POLICY: what to do with a payment event that has no idempotency key.')
@allowed([
  'park'
  'sequence'
])
param paymentsMissingKeyPolicy string = 'park'

@description('PAYMENTS_MAX_ATTEMPTS: tries per account group before the batch raises for the host\'s retry (transient failures never park).')
@minValue(1)
param paymentsMaxAttempts int = 3

@description('PAYMENTS_MAX_CONCURRENCY: account groups of one Event Hubs batch committed concurrently.')
@minValue(1)
param paymentsMaxConcurrency int = 16

@description('OUTBOX_DUPLICATE_DETECTION_SECONDS: duplicate-detection window of the outbox destinations (the notifications topic, the balance-changes queue). The app refuses to start when it is shorter than the redelivery window (lock x deliveries + margin): a re-dispatch inside it is dropped by the broker.')
@minValue(20)
@maxValue(604800)
param outboxDuplicateDetectionSeconds int = 172800

@description('OUTBOX_SWEEP_AGE_SECONDS: the maintenance timer dispatches outgoing messages pending longer than this.')
@minValue(1)
param outboxSweepAgeSeconds int = 600

@description('Alert when an outgoing message has been pending longer than this many seconds.')
@minValue(60)
param outboxPendingAlertSeconds int = 3600

@description('HTTP_CALLER_HEADER: the request header that names the authenticated caller of POST /api/payments, set by a front end (e.g. API Management) that overwrites any client-sent copy; Idempotency-Keys are scoped per caller. Empty: App Service authentication\'s caller, if httpAuthClientId turns it on, else one shared scope.')
param httpCallerHeader string = ''

@description('Client id of the Entra ID app registration of the HTTP API: turns on App Service authentication (authsettingsV2), which identifies each caller, so Idempotency-Keys are scoped per caller. Empty (default): off; function keys alone share one key scope between all callers.')
param httpAuthClientId string = ''

@description('DEDUP_LOG_DUPLICATES: log every duplicate (and in-progress claim) at INFO, for an investigation. Off: duplicates are counted by cause in the dedup.messages metric only (customMetrics), and logged at DEBUG.')
param dedupLogDuplicates bool = false

@description('TRACE_SAMPLING_RATIO: share of traces (message spans and their store calls) the app exports, 0 to 1 (fixed-percentage sampler; Application Insights scales counts back up). Logs and metrics are never sampled.')
param traceSamplingRatio string = '0.001'

@description('TABLE_BATCH_CODEC: lean = Table entity-group transactions through the app\'s lean $batch codec (it falls back to the SDK\'s path by itself on an SDK it does not support); sdk = always the SDK\'s submit_transaction.')
@allowed([
  'lean'
  'sdk'
])
param tableBatchCodec string = 'lean'

@description('MAINTENANCE_SCHEDULE: NCRONTAB schedule of the maintenance timer (stale in-progress markers, expiry sweep).')
param maintenanceSchedule string = '0 */15 * * * *'

// --- Sizing --------------------------------------------------------------------------------
@description('Cosmos DB capacity mode: true = serverless, false = provisioned autoscale.')
param cosmosServerless bool = true

@description('Autoscale max RU/s of the Cosmos DB database when cosmosServerless is false.')
@minValue(1000)
param cosmosAutoscaleMaxThroughput int = 1000

@description('Partitions of the payments event hub.')
@minValue(1)
@maxValue(32)
param eventHubPartitionCount int = 4

@description('Days the payments event hub retains events (Standard tier: 1..7). A consumer that is down longer than this loses events.')
@minValue(1)
@maxValue(7)
param eventHubMessageRetentionInDays int = 7

@description('Maximum instances of the Flex Consumption app.')
@minValue(40)
@maxValue(1000)
param functionMaximumInstanceCount int = 100

@description('Memory per Flex Consumption instance.')
@allowed([
  512
  2048
  4096
])
param functionInstanceMemoryMB int = 2048

// --- Alerts --------------------------------------------------------------------------------
@description('E-mail address for alert notifications. Empty: alerts fire without notifications.')
param alertEmailAddress string = ''

@description('Duplicate spike alert: minimum duplicates in 15 minutes.')
@minValue(1)
param duplicateSpikeMinCount int = 20

@description('Duplicate spike alert: multiple of the 24 h baseline that counts as a spike.')
@minValue(1)
param duplicateSpikeFactor int = 3

// --- Derived values --------------------------------------------------------------------------
var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName))
var functionAppName = 'func-idem-${resourceToken}'
var deploymentContainerName = 'app-package-${resourceToken}'

// Retention rule of the spec (PATTERN.md requirement 8), enforced again by the app at startup:
// a dedup marker must outlive every redelivery of its message. Each delivery can hold the
// message for max(lock, renewal) seconds, there are at most maxDeliveryCount deliveries, and the
// margin covers late handling (dead-letter resubmission). Derived here, so it holds by construction.
var dedupTtlSeconds = (max(serviceBusLockDurationSeconds, serviceBusMaxAutoLockRenewalSeconds) * serviceBusMaxDeliveryCount) + dedupRetentionMarginSeconds

// The host's lock renewal comes from the same parameter (an app setting overrides host.json
// extensions.serviceBus.maxAutoLockRenewalDuration), so the derivation above and the host agree.
var renewalHours = padLeft(string(serviceBusMaxAutoLockRenewalSeconds / 3600), 2, '0')
var renewalMinutes = padLeft(string((serviceBusMaxAutoLockRenewalSeconds % 3600) / 60), 2, '0')
var renewalSeconds = padLeft(string(serviceBusMaxAutoLockRenewalSeconds % 60), 2, '0')
var maxAutoLockRenewalDuration = '${renewalHours}:${renewalMinutes}:${renewalSeconds}'

// The queue trigger's retry delay as host.json writes it (hh:mm:ss); under an hour.
var queueRetryMinutes = padLeft(string(queueVisibilityTimeoutSeconds / 60), 2, '0')
var queueRetrySeconds = padLeft(string(queueVisibilityTimeoutSeconds % 60), 2, '0')
var queueVisibilityTimeout = '00:${queueRetryMinutes}:${queueRetrySeconds}'

module identity 'core/identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-idem-${resourceToken}'
    location: location
    tags: tags
  }
}

module monitoring 'core/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: 'log-idem-${resourceToken}'
    applicationInsightsName: 'appi-idem-${resourceToken}'
    location: location
    tags: tags
    appPrincipalId: identity.outputs.principalId
    developerPrincipalId: principalId
    developerPrincipalType: principalType
  }
}

// Charts over the app's metrics and events, next to the component they read.
module workbook 'core/workbook.bicep' = {
  name: 'workbook'
  params: {
    location: location
    tags: tags
    applicationInsightsId: monitoring.outputs.applicationInsightsId
  }
}

module storage 'core/storage.bicep' = {
  name: 'storage'
  params: {
    name: 'stidem${resourceToken}'
    location: location
    tags: tags
    deploymentContainerName: deploymentContainerName
    auditQueueName: orderAuditQueueName
    appPrincipalId: identity.outputs.principalId
    developerPrincipalId: principalId
    developerPrincipalType: principalType
  }
}

module serviceBus 'core/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    name: 'sb-idem-${resourceToken}'
    location: location
    tags: tags
    ordersQueueName: ordersQueueName
    orderStatusQueueName: orderStatusQueueName
    notificationsTopicName: notificationsTopicName
    notifySubscriptionName: notifySubscriptionName
    auditSubscriptionName: auditSubscriptionName
    balanceChangesQueueName: balanceChangesQueueName
    lockDurationSeconds: serviceBusLockDurationSeconds
    maxDeliveryCount: serviceBusMaxDeliveryCount
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    outboxDuplicateDetectionSeconds: outboxDuplicateDetectionSeconds
    defaultMessageTimeToLive: defaultMessageTimeToLive
    appPrincipalId: identity.outputs.principalId
    developerPrincipalId: principalId
    developerPrincipalType: principalType
  }
}

module eventHubs 'core/eventhubs.bicep' = {
  name: 'eventhubs'
  params: {
    name: 'evhns-idem-${resourceToken}'
    location: location
    tags: tags
    paymentsHubName: paymentsHubName
    paymentsConsumerGroupName: paymentsConsumerGroupName
    partitionCount: eventHubPartitionCount
    messageRetentionInDays: eventHubMessageRetentionInDays
    appPrincipalId: identity.outputs.principalId
    developerPrincipalId: principalId
    developerPrincipalType: principalType
  }
}

module cosmos 'core/cosmos.bicep' = {
  name: 'cosmos'
  params: {
    name: 'cosmos-idem-${resourceToken}'
    location: location
    tags: tags
    databaseName: cosmosDatabaseName
    serverless: cosmosServerless
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    appPrincipalId: identity.outputs.principalId
    developerPrincipalId: principalId
  }
}

module alerts 'core/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    tags: tags
    namePrefix: 'idem-${resourceToken}'
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    serviceBusNamespaceId: serviceBus.outputs.id
    deadLetterEntityNames: [
      ordersQueueName
      orderStatusQueueName
      notificationsTopicName
      balanceChangesQueueName
    ]
    alertEmailAddress: alertEmailAddress
    outboxPendingAlertSeconds: outboxPendingAlertSeconds
    duplicateSpikeMinCount: duplicateSpikeMinCount
    duplicateSpikeFactor: duplicateSpikeFactor
  }
}

// The settings contract. Each identity-based connection (AzureWebJobsStorage,
// ServiceBusConnection, EventHubConnection) names the user-assigned identity through
// `__credential` + `__clientId`; the app's own SDK clients (Cosmos, Tables) use
// DefaultAzureCredential, which picks the same identity from AZURE_CLIENT_ID.
// COSMOS_KEY and TABLE_CONNECTION_STRING are local-only and deliberately absent.
var appSettings = {
  AzureWebJobsStorage__blobServiceUri: storage.outputs.blobEndpoint
  AzureWebJobsStorage__tableServiceUri: storage.outputs.tableEndpoint
  // The order_audit queue trigger (and the app's poison-queue client) on the same account.
  AzureWebJobsStorage__queueServiceUri: storage.outputs.queueEndpoint
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identity.outputs.clientId
  ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identity.outputs.clientId
  EventHubConnection__fullyQualifiedNamespace: eventHubs.outputs.fullyQualifiedNamespace
  EventHubConnection__credential: 'managedidentity'
  EventHubConnection__clientId: identity.outputs.clientId
  ORDERS_QUEUE_NAME: ordersQueueName
  ORDER_STATUS_QUEUE_NAME: orderStatusQueueName
  NOTIFICATIONS_TOPIC_NAME: notificationsTopicName
  NOTIFY_SUBSCRIPTION_NAME: notifySubscriptionName
  AUDIT_SUBSCRIPTION_NAME: auditSubscriptionName
  BALANCE_CHANGES_QUEUE: balanceChangesQueueName
  ORDER_AUDIT_QUEUE_NAME: orderAuditQueueName
  QUEUE_MAX_DEQUEUE_COUNT: string(queueMaxDequeueCount)
  AzureFunctionsJobHost__extensions__queues__maxDequeueCount: string(queueMaxDequeueCount)
  AzureFunctionsJobHost__extensions__queues__visibilityTimeout: queueVisibilityTimeout
  PAYMENTS_HUB_NAME: paymentsHubName
  PAYMENTS_CONSUMER_GROUP: paymentsConsumerGroupName
  DEDUP_BACKEND: dedupBackend
  COSMOS_ENDPOINT: cosmos.outputs.endpoint
  COSMOS_DATABASE: cosmosDatabaseName
  // The account core/cosmos.bicep creates has one write region (enableMultipleWriteLocations:
  // false), so the app never needs to accept duplicates across write regions there.
  COSMOS_ACCEPT_DUPLICATES_ACROSS_WRITE_REGIONS: 'false'
  TABLE_ENDPOINT: storage.outputs.tableEndpoint
  TABLE_BATCH_CODEC: tableBatchCodec
  NOTIFICATION_API_URL: notificationApiUrl
  NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY: notificationApiHonoursIdempotencyKey ? 'true' : 'false'
  DEDUP_TTL_SECONDS: string(dedupTtlSeconds)
  DEDUP_LEASE_SECONDS: string(dedupLeaseSeconds)
  SERVICEBUS_LOCK_DURATION_SECONDS: string(serviceBusLockDurationSeconds)
  SERVICEBUS_MAX_DELIVERY_COUNT: string(serviceBusMaxDeliveryCount)
  SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS: string(serviceBusMaxAutoLockRenewalSeconds)
  AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration: maxAutoLockRenewalDuration
  DEDUP_RETENTION_MARGIN_SECONDS: string(dedupRetentionMarginSeconds)
  PAYMENTS_MISSING_KEY_POLICY: paymentsMissingKeyPolicy
  PAYMENTS_MAX_ATTEMPTS: string(paymentsMaxAttempts)
  PAYMENTS_MAX_CONCURRENCY: string(paymentsMaxConcurrency)
  OUTBOX_DUPLICATE_DETECTION_SECONDS: string(outboxDuplicateDetectionSeconds)
  OUTBOX_SWEEP_AGE_SECONDS: string(outboxSweepAgeSeconds)
  HTTP_CALLER_HEADER: httpCallerHeader
  MAINTENANCE_SCHEDULE: maintenanceSchedule
  DEDUP_LOG_DUPLICATES: dedupLogDuplicates ? 'true' : 'false'
  TRACE_SAMPLING_RATIO: traceSamplingRatio
  APPLICATIONINSIGHTS_CONNECTION_STRING: monitoring.outputs.connectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identity.outputs.clientId};Authorization=AAD'
  // One export path (infra/README.md, "Telemetry"): host.json sets telemetryMode OpenTelemetry and
  // this flag makes the Python worker report WorkerOpenTelemetryEnabled, so the host stops
  // forwarding the worker's logs; the app exports them itself (azure-monitor-opentelemetry).
  // PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY stays unset: it would make the worker configure a
  // second exporter next to the app's.
  PYTHON_ENABLE_OPENTELEMETRY: 'true'
  AZURE_CLIENT_ID: identity.outputs.clientId
  // Deterministic credential: DefaultAzureCredential tries the managed identity (AZURE_CLIENT_ID)
  // and nothing else instead of probing a chain (azure-identity 1.27, pinned). Local runs leave it unset
  // and keep the developer chain (az login, azd, VS Code).
  AZURE_TOKEN_CREDENTIALS: 'ManagedIdentityCredential'
}

module functionApp 'app/function-app.bicep' = {
  name: 'function-app'
  params: {
    name: functionAppName
    planName: 'plan-idem-${resourceToken}'
    location: location
    tags: tags
    identityId: identity.outputs.id
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    appSettings: appSettings
    pythonVersion: '3.13'
    maximumInstanceCount: functionMaximumInstanceCount
    instanceMemoryMB: functionInstanceMemoryMB
    authClientId: httpAuthClientId
  }
  // The host must not start before its identity can reach storage and the brokers.
  dependsOn: [
    storage
    serviceBus
    eventHubs
    cosmos
    monitoring
  ]
}

output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output SERVICE_API_NAME string = functionApp.outputs.name
output AZURE_CLIENT_ID string = identity.outputs.clientId
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output EVENTHUB_FULLY_QUALIFIED_NAMESPACE string = eventHubs.outputs.fullyQualifiedNamespace
output COSMOS_ENDPOINT string = cosmos.outputs.endpoint
output TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output BLOB_ENDPOINT string = storage.outputs.blobEndpoint
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.applicationInsightsName
output DEDUP_TTL_SECONDS int = dedupTtlSeconds
