"""The gateway: Anthropic's Managed Agents HTTP API on corral, for code written against the official SDKs.

`anthropic.Anthropic(base_url="http://127.0.0.1:8780", api_key=...)` and the rest of a client's code stays as it
is. The gateway holds no state of its own: sessions are `SessionWorkflow`s, agents and environments are versioned
records (one entity workflow each, `workflows/records.py`), listings come from Temporal's visibility, a session's
events from its log, and live previews from the stream relay. Run two and kill one: a client that reconnects to
the other misses nothing.

One module per resource family (`agents`, `environments`, `sessions`, `events`, `session_admin`, `repositories`,
`vaults`) on a small core (`auth`, `owned`, `errors`, `http`, `pages`, `records`, `shapes`); `gateway/app.py` says
how to add one.
"""
