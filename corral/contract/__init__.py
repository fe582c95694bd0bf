"""The contract: every pydantic model that crosses a workflow boundary (persisted schemas).

One module per boundary: `session` (start input, updates, queries), `agent` (the agent a session runs),
`user_events` (what a client sends into a session), `events` (the log's event types),
`activities` (model turns and hands), `sandbox` (the environment recipe and handle), `proxy` (vaults, MCP, git),
`errors`. Import from those modules; this package imports nothing, so reading one schema loads only its module.
"""
