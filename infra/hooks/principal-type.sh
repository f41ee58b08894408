#!/usr/bin/env bash
# azd preprovision hook (Linux, macOS): sets AZURE_PRINCIPAL_TYPE to User or ServicePrincipal for
# the identity azd is signed in with, the one azd passes as AZURE_PRINCIPAL_ID. Role assignments
# must declare the right principalType; 'User' for a service principal fails `azd provision` in CI.
# Entra access tokens carry the delegated-scope claim `scp` only when a user signed in; app-only
# tokens (service principal, managed identity, federated CI credential) never do.
set -euo pipefail

json=$(azd auth token --output json | tr -d '\r\n')
token=$(printf '%s' "$json" | sed -E 's/.*"token"[[:space:]]*:[[:space:]]*"([^"]+)".*/\1/')
payload=$(printf '%s' "$token" | cut -d. -f2 | tr '_-' '/+')
while [ $(( ${#payload} % 4 )) -ne 0 ]; do payload="$payload="; done
claims=$(printf '%s' "$payload" | base64 -d)
case "$claims" in
  *'"oid"'*) ;;
  *) echo "preprovision: no access token from 'azd auth token'; run 'azd auth login'" >&2; exit 1 ;;
esac
case "$claims" in
  *'"scp"'*) type=User ;;
  *) type=ServicePrincipal ;;
esac
echo "preprovision: AZURE_PRINCIPAL_TYPE=$type"
azd env set AZURE_PRINCIPAL_TYPE "$type"
