"""An outcome through the official `anthropic` SDK: the agent works until a grader finds the work meets a rubric.
Run it with: `corral up && export CORRAL_API_KEY=$(corral api-key create --workspace demo)`, then
`python examples/outcomes.py` (CORRAL_MODEL=claude-sonnet-4-6 when `corral up` had ANTHROPIC_API_KEY;
CORRAL_API_URL for another gateway).
"""

from connect import MODEL, connect  # examples/connect.py: CORRAL_API_URL, CORRAL_API_KEY, CORRAL_MODEL

client = connect()
agent = client.beta.agents.create(name="poet", model=MODEL)
environment = client.beta.environments.create(name="plain")
session = client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
with client.beta.sessions.events.stream(session.id) as stream:
    client.beta.sessions.events.send(
        session.id,
        events=[
            {
                "type": "user.define_outcome",
                "description": "Write a haiku about rivers.",
                "rubric": {"type": "text", "content": "Three lines of 5, 7 and 5 syllables. It mentions water."},
                "max_iterations": 3,
            }
        ],
    )
    for event in stream:
        if event.type == "agent.message":
            print("agent:", "".join(block.text for block in event.content if block.type == "text"))
        elif event.type == "span.outcome_evaluation_start":
            print(f"grading (cycle {event.iteration + 1})")
        elif event.type == "span.outcome_evaluation_end":
            print(f"grader: {event.result}: {event.explanation}")
        elif event.type == "session.status_idle":
            break
for evaluation in client.beta.sessions.retrieve(session.id).outcome_evaluations:
    print(f"{evaluation.outcome_id}: {evaluation.result} after {evaluation.iteration + 1} cycle(s)")
