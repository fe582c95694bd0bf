"""Worker processes, one per role (harness, model, hands), plus an all-in-one for local use."""
