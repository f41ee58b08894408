"""Azure Functions triggers (blueprints): thin adapters from bindings to domain services."""
