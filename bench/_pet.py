"""The "pet" baseline of `bench/ttft.py`: a bench-only workflow that readies a session's sandbox the way a
coupled design must before its first model call, using corral's real sandbox activities on the real engine.

It runs `provision_sandbox` (create the container from the default recipe: workspace volume prepared, hardened
container created and started) on `corral-sandbox`, then one `execute` of `bash` in it that makes a small git
repository in the workspace and clones it into `/workspace/repo`. The sandbox has no network, so the origin is
local, but the clone (`--no-local`: packed and copied, not hard-linked) is real git work in the container;
`repo_mb` adds incompressible data to make the repository bigger. The container is generation 0 of the session's
own name, so when the session later calls a tool, its lazy `provision_sandbox` finds the container running and
reuses it: one container per session, made up front.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput
    from corral.contract.sandbox import Environment, ProvisionInput, SandboxHandle
    from corral.names import ACTIVITY_EXECUTE, ACTIVITY_PROVISION_SANDBOX, SANDBOX_TASK_QUEUE

PET_SETUP_WORKFLOW = "BenchPetSetup"


def clone_command(repo_mb: int) -> str:
    """Make a repository of 40 small files (plus `repo_mb` MB of incompressible data) and clone it."""
    blob = f"head -c {repo_mb}M /dev/urandom > data.bin; " if repo_mb > 0 else ""
    return (
        "set -e; git init -q /workspace/.origin; cd /workspace/.origin; "
        f"for i in $(seq 1 40); do printf 'line %s\\n' $i > file$i.txt; done; {blob}git add -A; "
        "git -c user.email=bench@corral.invalid -c user.name=bench commit -qm 'initial import'; "
        "git clone -q --no-local /workspace/.origin /workspace/repo; ls /workspace/repo | wc -l"
    )


class PetSetupInput(BaseModel):
    session_id: str
    namespace: str = "default"
    repo_mb: int = 0


@workflow.defn(name=PET_SETUP_WORKFLOW)
class PetSetupWorkflow:
    """Provision the session's container and clone a repository into it, before the session exists."""

    @workflow.run
    async def run(self, input: PetSetupInput) -> str:
        handle: SandboxHandle = await workflow.execute_activity(
            ACTIVITY_PROVISION_SANDBOX,
            ProvisionInput(
                session_id=input.session_id, environment=Environment(), generation=0, namespace=input.namespace
            ),
            task_queue=SANDBOX_TASK_QUEUE,
            result_type=SandboxHandle,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=10),
        )
        cloned: str = await workflow.execute_activity(
            ACTIVITY_EXECUTE,
            ExecuteInput(
                session_id=input.session_id,
                tool_use_id=f"bench-clone-{workflow.uuid4().hex[:12]}",
                name="bash",
                input={"command": clone_command(input.repo_mb)},
                sandbox=handle,
            ),
            task_queue=handle.task_queue,
            result_type=str,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=3),
        )
        return cloned
