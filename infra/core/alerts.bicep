// Alert rules of the idempotent consumers.
//
// Each log alert reads ONE table of the Application Insights component. The app exports its
// telemetry itself through OpenTelemetry (azure-monitor-opentelemetry; host.json telemetryMode
// OpenTelemetry, so the host forwards none of it a second time):
//
//  * Log records become `traces` (AppTraces in the workspace) whose customDimensions carry the
//    record's `extra` fields; the field `event` names what happened. The app logs only what a
//    person acts on, so the event rules read `traces`. Nothing writes customEvents.
//  * Per-message counts are OpenTelemetry metrics, aggregated in the process and exported once a
//    minute: `customMetrics` (AppMetrics), one row per metric, attribute set and interval, with
//    `name`, `valueSum` (the count of the interval for a counter) and the attributes in
//    customDimensions. The duplicate spike rule reads them.
//
//  * IdempotencyKeyConflict: new conflicts (an idempotency key reused with different content).
//  * EventParked: new parked messages, from payments (event hub) and from the notification
//    consumers (notify, audit), plus claims the maintenance timer had to close.
//  * MessageDeadLettered: new messages the app dead-lettered itself (orders rejected by the store).
//  * SequenceReset: an event hub partition's sequence numbers restarted below the app's high-water
//    mark (hub recreated, disaster-recovery failover); the events were applied through their keys.
//  * Duplicate rate spike (dedup.messages, outcome duplicate): the duplicates of the last 15
//    minutes are well above their 24 h baseline (misconfigured producer, too short locks,
//    unhealthy consumer).
//  * Dead-letter queues not empty (platform metric, stateless): catches the dead-letters the app
//    never sees (max delivery count reached, TTL expired) and keeps reminding until an operator
//    drains the queue with the replay tool.
//
// The four event alerts count the events of their evaluation window (window = frequency, so each
// event is counted once) and are stateless: every window with new events fires again, an alert
// that already fired never hides the next conflict, parking or dead-letter.

@description('Region of the log alert rules.')
param location string

@description('Tags applied to the rules.')
param tags object = {}

@description('Name prefix of the rules.')
param namePrefix string

@description('Resource id of the Application Insights component the app logs to.')
param applicationInsightsId string

@description('Resource id of the Service Bus namespace.')
param serviceBusNamespaceId string

@description('Service Bus entities whose dead-letter queues are watched (queues and topics).')
param deadLetterEntityNames array

@description('E-mail address notified by the alerts. Empty: rules fire without notification (visible in Azure Monitor).')
param alertEmailAddress string = ''

@description('Outbox: alert when the oldest outgoing message the maintenance sweep found pending is older than this (seconds).')
@minValue(60)
param outboxPendingAlertSeconds int = 3600

@description('Duplicate spike: minimum duplicates in the window before the rule can fire.')
@minValue(1)
param duplicateSpikeMinCount int = 20

@description('Duplicate spike: the window count must exceed this multiple of the 24 h average per window.')
@minValue(1)
param duplicateSpikeFactor int = 3

// The single place where infra names the app's log events. Keep in step with the app's logging.
// DuplicateDetected is logged only with DEDUP_LOG_DUPLICATES=true (an investigation); the
// duplicate spike rule counts the metric instead.
var logEvents = {
  keyConflict: 'IdempotencyKeyConflict'
  parked: 'EventParked'
  deadLettered: 'MessageDeadLettered'
  duplicate: 'DuplicateDetected'
  sequenceReset: 'SequenceReset'
}

// The app's metrics the rules read (shared/telemetry.py), and the outcome attribute they filter on.
var appMetrics = {
  messages: 'dedup.messages'
  duplicateOutcome: 'duplicate'
}

// One table, one event each; the projected columns are the alert dimensions.
var conflictQuery = 'traces | where tostring(customDimensions.event) == "${logEvents.keyConflict}" | extend consumer = tostring(customDimensions.consumer) | project timestamp, consumer, message'
var parkedQuery = 'traces | where tostring(customDimensions.event) == "${logEvents.parked}" | extend consumer = tostring(customDimensions.consumer), reason = tostring(customDimensions.reason) | project timestamp, consumer, reason, message'
var sequenceResetQuery = 'traces | where tostring(customDimensions.event) == "${logEvents.sequenceReset}" | extend consumer = tostring(customDimensions.consumer) | project timestamp, consumer, message'
var deadLetteredQuery = 'traces | where tostring(customDimensions.event) == "${logEvents.deadLettered}" | extend consumer = tostring(customDimensions.consumer), reason = tostring(customDimensions.reason) | project timestamp, consumer, reason, message'

// The app's gauge outbox.oldest_pending_age (shared/telemetry.py), set by every maintenance run.
var outboxPendingQuery = 'customMetrics | where name == "outbox.oldest_pending_age" | where value > ${outboxPendingAlertSeconds} | project timestamp, value'

// 15-minute window compared with the average 15-minute count of the preceding day (95 windows).
// Duplicates of every cause and consumer: the sum of the counter's per-interval values.
var duplicateSpikeQuery = 'let dups = customMetrics | where name == "${appMetrics.messages}" and tostring(customDimensions.outcome) == "${appMetrics.duplicateOutcome}"; let recent = todouble(coalesce(toscalar(dups | where timestamp > ago(15m) | summarize sum(valueSum)), 0.0)); let baseline = todouble(coalesce(toscalar(dups | where timestamp between (ago(1d) .. ago(15m)) | summarize sum(valueSum)), 0.0)) / 95.0; print recentCount = recent, baselineCount = baseline | where recentCount >= ${duplicateSpikeMinCount} and recentCount > ${duplicateSpikeFactor} * baselineCount'

var byConsumer = [
  {
    name: 'consumer'
    operator: 'Include'
    values: [
      '*'
    ]
  }
]

var byConsumerAndReason = [
  {
    name: 'consumer'
    operator: 'Include'
    values: [
      '*'
    ]
  }
  {
    name: 'reason'
    operator: 'Include'
    values: [
      '*'
    ]
  }
]

var actionGroupIds = empty(alertEmailAddress) ? [] : [
  actionGroup.id
]

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmailAddress)) {
  name: '${namePrefix}-ops'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'idem-ops'
    enabled: true
    emailReceivers: [
      {
        name: 'operator'
        emailAddress: alertEmailAddress
        useCommonAlertSchema: true
      }
    ]
  }
}

resource keyConflictAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-idempotency-key-conflicts'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'New idempotency key conflicts (${logEvents.keyConflict})'
    description: 'A message reused an idempotency key with different content in the last 5 minutes (one alert per consumer). The message was not applied; orders dead-letters it. Inspect the dead-letter queue or the parked entry and the producer.'
    severity: 1
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: conflictQuery
          timeAggregation: 'Count'
          dimensions: byConsumer
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

resource parkedAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-messages-parked'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'New parked messages: payments and notifications (${logEvents.parked})'
    description: 'Messages were parked in the last 5 minutes instead of applied: payment events (event hub), notify and audit deliveries whose outcome is unknown, and claims closed by the maintenance timer. One alert per consumer and reason. Review the parked table and replay or discard with the replay tool.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: parkedQuery
          timeAggregation: 'Count'
          dimensions: byConsumerAndReason
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

resource outboxPendingAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-outbox-pending'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Outgoing messages pending longer than ${outboxPendingAlertSeconds} s'
    description: 'A committed effect\'s outgoing messages (orders -> notifications topic) have not been recorded as dispatched for longer than the threshold: the broker refuses them (missing Data Sender role or entity) or is down. The maintenance sweep keeps retrying; list them with `python -m replay outbox list`.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'PT30M'
    criteria: {
      allOf: [
        {
          query: outboxPendingQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

resource deadLetteredAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-messages-dead-lettered-by-app'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'New messages dead-lettered by the app (${logEvents.deadLettered})'
    description: 'The app dead-lettered messages in the last 5 minutes (orders: rejected by the store, e.g. invalid keys or documents). One alert per consumer and reason. Inspect the dead-letter queue and replay or discard with the replay tool.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: deadLetteredQuery
          timeAggregation: 'Count'
          dimensions: byConsumerAndReason
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

resource sequenceResetAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-event-hub-sequence-resets'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Event hub sequence numbers restarted (${logEvents.sequenceReset})'
    description: 'An event hub partition delivered events numbered below the high-water mark but enqueued after it in the last 5 minutes (the hub was recreated, or failed over to the disaster-recovery namespace). Nothing was skipped: the events were applied through their keys and the mark moved to the new numbers. Confirm the recreation or failover was intended. One alert per consumer.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: sequenceResetQuery
          timeAggregation: 'Count'
          dimensions: byConsumer
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

resource duplicateSpikeAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-duplicate-rate-spike'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Duplicate rate spike (${appMetrics.messages} outcome=${appMetrics.duplicateOutcome})'
    description: 'Detected duplicates in the last 15 minutes (metric ${appMetrics.messages}, customMetrics) are far above the day\'s baseline: check producer retries, lock duration and consumer health. Break them down by customDimensions.cause and consumer; set DEDUP_LOG_DUPLICATES=true to log each one.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'P1D'
    criteria: {
      allOf: [
        {
          query: duplicateSpikeQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

// DeadletteredMessages is a gauge (messages currently in a dead-letter queue; Average, Minimum and
// Maximum only, not exportable through diagnostic settings), so no Azure Monitor rule can compute
// its increase. Stateless (autoMitigate false) with Maximum: every evaluation in which a watched
// dead-letter queue held a message, even briefly, fires again, so new dead-letters never go unseen
// behind an alert that already fired; it stops when the queue is drained (replay or discard).
resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-servicebus-dead-letter-queues-not-empty'
  location: 'global'
  tags: tags
  properties: {
    description: 'A dead-letter queue of orders, order-status or the notifications subscriptions holds messages (max deliveries reached, expired, or dead-lettered by the app). Fires again every 15 to 30 minutes until the queue is drained with the replay tool.'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'PT15M'
    autoMitigate: false
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadletteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: deadLetterEntityNames
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [for id in actionGroupIds: {
      actionGroupId: id
    }]
  }
}

output logEventNames object = logEvents
output metricNames object = appMetrics
