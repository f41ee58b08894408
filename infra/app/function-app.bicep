// Function App on the Flex Consumption plan (FC1), Python 3.13, running as the user-assigned
// managed identity. The deployment package lives in a blob container reached by that identity.
// App settings arrive as one object from resources.bicep (the settings contract).

@description('Function App name.')
param name string

@description('Flex Consumption plan name.')
param planName string

@description('Region of the plan and the app (must offer Flex Consumption).')
param location string

@description('Tags applied to the plan and the app.')
param tags object = {}

@description('Resource id of the user-assigned managed identity.')
param identityId string

@description('Blob container URL of the deployment package.')
param deploymentContainerUrl string

@description('App settings (name -> value). Identity-based connections only; no secrets.')
param appSettings object

@description('Python version of the Flex Consumption runtime.')
@allowed([
  '3.12'
  '3.13'
])
param pythonVersion string = '3.13'

@description('Upper bound of instances the plan scales out to.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Memory per instance.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Client id of an Entra ID app registration that callers of POST /api/payments get tokens for. Set: App Service authentication (authsettingsV2) requires an Entra ID token on every HTTP request and passes the caller to the app (X-MS-CLIENT-PRINCIPAL-IDP/-ID), so Idempotency-Keys are scoped per caller. Empty (default): off; function keys identify no caller and every caller shares one key scope.')
param authClientId string = ''

// azd finds the app to deploy to by this tag (service `api` in azure.yaml).
var serviceTags = {
  'azd-service-name': 'api'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: zone redundancy of Flex Consumption plans is available in a subset of regions only; this reference template stays deployable everywhere FC1 exists. Set properties.zoneRedundant for production in a supporting region.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_17: mutual TLS is not this app's client authentication: the HTTP endpoint (POST /api/payments) is protected by function keys (front it with API Management or Entra ID auth for production), and the broker triggers are outbound connections.
  // checkov:skip=CKV_AZURE_222: the app serves a public, function-key protected HTTP endpoint and receives deployments over Entra ID; this template has no VNet or private endpoint to confine it to (broker triggers are outbound and unaffected).
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales on trigger load (to zero when idle); a fixed minimum instance count is a cost choice, not a correctness one, for queue-driven consumers whose messages wait in the broker.
  // checkov:skip=CKV_AZURE_213: an HTTP health probe says nothing about trigger-driven consumers on a scale-to-zero plan; their health is watched through the dead-letter, parked-event and duplicate-rate alerts (core/alerts.bicep).
  name: name
  location: location
  tags: union(tags, serviceTags)
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: identityId
    siteConfig: {
      appSettings: [for setting in items(appSettings): {
        name: setting.key
        value: setting.value
      }]
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: pythonVersion
      }
    }
  }
}

// Caller identity for the HTTP API (off by default): the platform validates the Entra ID token,
// strips any client-sent X-MS-CLIENT-PRINCIPAL* headers and sets them for the caller; the app
// scopes Idempotency-Keys by them. Function keys are still required on top (auth_level FUNCTION).
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = if (!empty(authClientId)) {
  // checkov:skip=CKV_AZURE_13: this resource is the App Service authentication setting itself (checkov looks for it inside a site's configuration)
  // checkov:skip=CKV_AZURE_63: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  // checkov:skip=CKV_AZURE_65: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  // checkov:skip=CKV_AZURE_66: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  // checkov:skip=CKV_AZURE_80: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  // checkov:skip=CKV_AZURE_88: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  // checkov:skip=CKV_AZURE_222: checkov reads every Microsoft.Web/sites/config resource as a site's configuration; this one is the authsettingsV2 document only, and the site (functionApp above) is where that setting lives
  parent: functionApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: authClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${authClientId}'
            authClientId
          ]
        }
      }
    }
  }
}

// Publishing goes through Entra ID (azd deploy / func azure functionapp publish / OneDeploy);
// basic (user name + password) publishing credentials are switched off.
resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

output id string = functionApp.id
output name string = functionApp.name
output defaultHostName string = functionApp.properties.defaultHostName
