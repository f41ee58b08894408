// Log Analytics workspace + workspace-based Application Insights.
// Local (instrumentation-key) auth is disabled on Application Insights: the app sends telemetry
// with its managed identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING), which needs the
// Monitoring Metrics Publisher role granted here, next to the component.

@description('Log Analytics workspace name.')
param logAnalyticsName string

@description('Application Insights component name.')
param applicationInsightsName string

@description('Region of both resources.')
param location string

@description('Tags applied to both resources.')
param tags object = {}

@description('Log retention in days.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

@description('Principal id of the Function App managed identity.')
param appPrincipalId string

@description('Optional developer principal id (may publish telemetry from a local run). Empty: no assignment.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param developerPrincipalType string = 'User'

// Monitoring Metrics Publisher.
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb'

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      enableLogAccessUsingOnlyResourcePermissions: true
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
  }
}

resource appMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, appPrincipalId, monitoringMetricsPublisherRoleId)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource devMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(applicationInsights.id, developerPrincipalId, monitoringMetricsPublisherRoleId)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

output logAnalyticsId string = logAnalytics.id
output applicationInsightsId string = applicationInsights.id
output applicationInsightsName string = applicationInsights.name
output connectionString string = applicationInsights.properties.ConnectionString
