// Alert rules of the idempotent consumers.
//  * IdempotencyKeyConflict: an order id was reused with different content; the message was
//    dead-lettered and a person must look at it (log query, any occurrence).
//  * EventParked: a payment event could not be applied and was parked (log query, any occurrence).
//  * DuplicateDetected spike: the duplicate rate of the last window is well above its 24 h
//    baseline: a misconfigured producer, too short lock windows or an unhealthy consumer.
//  * Dead-lettered messages on the queues and the topic (platform metric).
// The log alerts match the stable event names the app emits, whether the event arrives as a
// trace (message text or customDimensions) or as a custom event.

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

@description('Service Bus entities whose dead-letter count raises an alert (queues and topics).')
param deadLetterEntityNames array

@description('E-mail address notified by the alerts. Empty: rules fire without notification (visible in Azure Monitor).')
param alertEmailAddress string = ''

@description('Duplicate spike: minimum duplicates in the window before the rule can fire.')
@minValue(1)
param duplicateSpikeMinCount int = 20

@description('Duplicate spike: the window count must exceed this multiple of the 24 h average per window.')
@minValue(1)
param duplicateSpikeFactor int = 3

// The single place where infra names the app's log events. Keep in step with the app's logging.
var logEvents = {
  keyConflict: 'IdempotencyKeyConflict'
  parked: 'EventParked'
  duplicate: 'DuplicateDetected'
}

// Rows of traces or customEvents carrying one event name.
var conflictRows = 'union isfuzzy=true (traces | where message has "${logEvents.keyConflict}" or tostring(customDimensions) has "${logEvents.keyConflict}"), (customEvents | where name == "${logEvents.keyConflict}")'
var parkedRows = 'union isfuzzy=true (traces | where message has "${logEvents.parked}" or tostring(customDimensions) has "${logEvents.parked}"), (customEvents | where name == "${logEvents.parked}")'
var duplicateRows = 'union isfuzzy=true (traces | where message has "${logEvents.duplicate}" or tostring(customDimensions) has "${logEvents.duplicate}"), (customEvents | where name == "${logEvents.duplicate}")'

// 15-minute window compared with the average 15-minute count of the preceding day (95 windows).
var duplicateSpikeQuery = 'let dups = ${duplicateRows}; let recent = toscalar(dups | where timestamp > ago(15m) | count); let baseline = todouble(toscalar(dups | where timestamp between (ago(1d) .. ago(15m)) | count)) / 95.0; print recentCount = recent, baselineCount = baseline | where recentCount >= ${duplicateSpikeMinCount} and recentCount > ${duplicateSpikeFactor} * baselineCount'

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
  name: '${namePrefix}-idempotency-key-conflict'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Idempotency key conflict (${logEvents.keyConflict})'
    description: 'A message reused an idempotency key with different content and was dead-lettered. Inspect the dead-letter queue and the producer.'
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
          query: conflictRows
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

resource parkedAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-event-parked'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Payment event parked (${logEvents.parked})'
    description: 'A payment event was parked instead of applied. Review the parked table and replay or resolve it.'
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
          query: parkedRows
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

resource duplicateSpikeAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-duplicate-rate-spike'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Duplicate rate spike (${logEvents.duplicate})'
    description: 'Detected duplicates in the last 15 minutes are far above the day\'s baseline: check producer retries, lock duration and consumer health.'
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

resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-servicebus-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages were dead-lettered on a queue or topic subscription (max deliveries reached, expired, or an idempotency key conflict).'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
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
