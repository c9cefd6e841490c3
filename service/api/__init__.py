"""HTTP frontends: routers, problem responses, auth and limits."""
