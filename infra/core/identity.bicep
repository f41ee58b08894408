// User-assigned managed identity of the Function App.
// A user-assigned identity (rather than system-assigned) exists before the app does, so every
// role assignment can be created next to its resource before the host first starts, and its
// client id can be written into the app settings (`__clientId`, AZURE_CLIENT_ID).

@description('Name of the user-assigned managed identity.')
param name string

@description('Region of the identity.')
param location string

@description('Tags applied to the identity.')
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output clientId string = identity.properties.clientId
output principalId string = identity.properties.principalId
