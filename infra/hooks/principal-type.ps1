# azd preprovision hook (Windows): the same as principal-type.sh. Sets AZURE_PRINCIPAL_TYPE to User
# or ServicePrincipal for the identity azd is signed in with (AZURE_PRINCIPAL_ID). Entra access
# tokens carry the delegated-scope claim `scp` only when a user signed in.
$ErrorActionPreference = 'Stop'

$json = azd auth token --output json | Out-String
if ($LASTEXITCODE -ne 0) { throw "preprovision: 'azd auth token' failed; run 'azd auth login'" }
$payload = ($json | ConvertFrom-Json).token.Split('.')[1].Replace('-', '+').Replace('_', '/')
$payload = $payload.PadRight($payload.Length + (4 - $payload.Length % 4) % 4, '=')
$claims = [Text.Encoding]::UTF8.GetString([Convert]::FromBase64String($payload)) | ConvertFrom-Json
if (-not $claims.oid) { throw "preprovision: no access token from 'azd auth token'; run 'azd auth login'" }
$type = if ($claims.PSObject.Properties.Name -contains 'scp') { 'User' } else { 'ServicePrincipal' }
Write-Host "preprovision: AZURE_PRINCIPAL_TYPE=$type"
azd env set AZURE_PRINCIPAL_TYPE $type
if ($LASTEXITCODE -ne 0) { throw 'preprovision: azd env set failed' }
