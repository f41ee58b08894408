// Azure Monitor workbook of the idempotent consumers, attached to the Application Insights component.
//
// The charts (workbook.json, kept apart so it stays plain JSON the portal can import and export) read
// the app's OpenTelemetry metrics as they land in Application Insights (`customMetrics`: name = the
// metric, attributes in customDimensions) and its log events (`traces`, customDimensions.event):
// messages by consumer and outcome, duplicates by cause, key conflicts, parked and dead-lettered
// messages by reason, store latency by backend and Event Hubs mark lag per partition.
// tests/infra/test_infra_workbook.py holds every query to the names the app emits.

@description('Region of the workbook.')
param location string

@description('Tags applied to the workbook.')
param tags object = {}

@description('Resource id of the Application Insights component the app sends its telemetry to.')
param applicationInsightsId string

@description('Name shown in the portal.')
param displayName string = 'Idempotent consumers'

// The JSON names the component as its fallback resource; the deployment fills in the real id.
var serializedData = replace(loadTextContent('workbook.json'), '__APPLICATION_INSIGHTS_ID__', applicationInsightsId)

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  // A workbook's name must be a GUID; derived from the component, so redeployments update it in place.
  name: guid(applicationInsightsId, 'idempotent-consumers-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    sourceId: toLower(applicationInsightsId)
    serializedData: serializedData
    version: 'Notebook/1.0'
  }
}

output id string = workbook.id
