// Subscription-scope entry point: creates (or reuses) the resource group and deploys
// resources.bicep into it. Used by `azd up` / `azd provision` (parameters from
// main.parameters.json) and by `az deployment sub create`.
// Delivery/retention knobs (lock duration, max delivery count, duplicate detection window,
// margins) keep their defaults from resources.bicep; deploy resources.bicep with
// `az deployment group create` to override them.

targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('Environment name (azd: AZURE_ENV_NAME); names the resource group and seeds unique names.')
param environmentName string

@minLength(1)
@description('Region of every resource; must offer the Flex Consumption plan.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Resource group name. Empty: rg-<environmentName>.')
param resourceGroupName string = ''

@description('Object id of the deploying principal (azd: AZURE_PRINCIPAL_ID). Receives data-plane roles only when grantDeployerDataRoles is true.')
param principalId string = ''

@description('Principal type of principalId (azd: AZURE_PRINCIPAL_TYPE, set by the preprovision hook in infra/hooks from the signed-in identity).')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('Opt-in: give principalId the data-plane roles to run the app locally against these resources and send test traffic (azd: GRANT_DEPLOYER_DATA_ROLES). Off by default, so production-like environments grant people no data access.')
param grantDeployerDataRoles bool = false

@description('DEDUP_BACKEND of the deployed app.')
@allowed([
  'cosmos'
  'table'
])
param dedupBackend string = 'cosmos'

@description('NOTIFICATION_API_URL of the deployed app (azd: NOTIFICATION_API_URL). Required: the notify and audit consumers call it for every message.')
@minLength(1)
param notificationApiUrl string

@description('NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY of the deployed app.')
param notificationApiHonoursIdempotencyKey bool = false

@description('Cosmos DB capacity mode: true = serverless, false = provisioned autoscale.')
param cosmosServerless bool = true

@description('Client id of the HTTP API\'s Entra ID app registration (azd: HTTP_AUTH_CLIENT_ID). Set: App Service authentication identifies each caller and Idempotency-Keys are scoped per caller. Empty (default): off, one shared key scope.')
param httpAuthClientId string = ''

@description('HTTP_CALLER_HEADER of the deployed app: the header a front end (API Management) sets to name the caller. Empty: not used.')
param httpCallerHeader string = ''

@description('E-mail address for alert notifications. Empty: alerts fire without notifications.')
param alertEmailAddress string = ''

var tags = {
  'azd-env-name': environmentName
  workload: 'idempotent-consumer'
}

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: empty(resourceGroupName) ? 'rg-${environmentName}' : resourceGroupName
  location: location
  tags: tags
}

module resources 'resources.bicep' = {
  name: 'idempotent-consumer-resources'
  scope: rg
  params: {
    environmentName: environmentName
    location: location
    tags: tags
    principalId: grantDeployerDataRoles ? principalId : ''
    principalType: principalType
    dedupBackend: dedupBackend
    notificationApiUrl: notificationApiUrl
    notificationApiHonoursIdempotencyKey: notificationApiHonoursIdempotencyKey
    cosmosServerless: cosmosServerless
    httpAuthClientId: httpAuthClientId
    httpCallerHeader: httpCallerHeader
    alertEmailAddress: alertEmailAddress
  }
}

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = resources.outputs.AZURE_FUNCTION_APP_NAME
output SERVICE_API_NAME string = resources.outputs.SERVICE_API_NAME
output AZURE_CLIENT_ID string = resources.outputs.AZURE_CLIENT_ID
output AZURE_STORAGE_ACCOUNT_NAME string = resources.outputs.AZURE_STORAGE_ACCOUNT_NAME
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = resources.outputs.SERVICEBUS_FULLY_QUALIFIED_NAMESPACE
output EVENTHUB_FULLY_QUALIFIED_NAMESPACE string = resources.outputs.EVENTHUB_FULLY_QUALIFIED_NAMESPACE
output COSMOS_ENDPOINT string = resources.outputs.COSMOS_ENDPOINT
output TABLE_ENDPOINT string = resources.outputs.TABLE_ENDPOINT
output BLOB_ENDPOINT string = resources.outputs.BLOB_ENDPOINT
output APPLICATIONINSIGHTS_NAME string = resources.outputs.APPLICATIONINSIGHTS_NAME
output DEDUP_TTL_SECONDS int = resources.outputs.DEDUP_TTL_SECONDS
