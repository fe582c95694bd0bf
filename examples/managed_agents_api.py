"""The Managed Agents API of a local corral, through the official `anthropic` SDK. Run it with:
`corral up && export CORRAL_API_KEY=$(corral api-key create --workspace demo) && python examples/managed_agents_api.py`
(CORRAL_MODEL=claude-sonnet-4-6 when `corral up` had ANTHROPIC_API_KEY; CORRAL_API_URL for another gateway).
"""

from connect import MODEL, connect  # examples/connect.py: CORRAL_API_URL, CORRAL_API_KEY, CORRAL_MODEL

client = connect()
agent = client.beta.agents.create(name="helper", model=MODEL)
environment = client.beta.environments.create(name="plain")
session = client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
with client.beta.sessions.events.stream(session.id, event_deltas=["agent.message"]) as stream:
    client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    )
    for event in stream:
        if event.type == "event_delta":
            print(event.delta.content.text, end="", flush=True)  # the reply while the model writes it
        elif event.type == "session.status_idle":
            break
