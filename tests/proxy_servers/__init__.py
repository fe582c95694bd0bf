"""Real servers the proxy tests talk to over HTTP: an MCP server that checks bearer tokens, an OAuth token
endpoint that refreshes them, and a smart-HTTP git server (`git http-backend`) that demands a token."""
