"""Sandbox activities: provision, execute (the built-in tools), stop, release. Docker access, no credential.

`provision_sandbox` runs on the shared queue of an engine pool (`corral-sandbox`, or `corral-sandbox.<name>` for
the workers started with `CORRAL_SANDBOX_ENGINE=<name>`) and answers with a handle naming the queue of the engine
that holds the container (`corral-sandbox@<engine>`); every later call for that container goes there, so a sandbox
worker can live on another host (`DOCKER_HOST`) and several can share one engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from typing import Any

import docker
from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.archive import tool_output_key
from corral.blobs import BlobStore, BlobStoreError, open_blob_store
from corral.contract.activities import ExecuteInput
from corral.contract.errors import SANDBOX_GONE, SANDBOX_UNAVAILABLE
from corral.contract.knowledge import Collected
from corral.contract.sandbox import (
    SANDBOX_TOOL_INPUTS,
    BashInput,
    CollectInput,
    ForkWorkspaceInput,
    ProvisionInput,
    SandboxHandle,
    SandboxRef,
)
from corral.errors import BlobNotFound
from corral.hands.errors import tool_error
from corral.hands.heartbeat import heartbeating
from corral.hands.output import OUTPUT_HEAD, OUTPUT_TAIL, cut_output
from corral.names import (
    ACTIVITY_COLLECT_KNOWLEDGE,
    ACTIVITY_EXECUTE,
    ACTIVITY_FORK_WORKSPACE,
    ACTIVITY_PROVISION_SANDBOX,
    ACTIVITY_RELEASE_SANDBOX,
    ACTIVITY_STOP_SANDBOX,
    DEFAULT_GIT_PROXY_PORT,
    SANDBOX_TASK_QUEUE,
)
from sandbox import containers, knowledge, running, sessions
from sandbox.errors import SandboxError, SandboxGone, SandboxSetupError
from sandbox.pool import PoolSettings, WarmPool, pool_key
from sandbox.runner import RunnerLost, Runners
from sandbox.workspace import copy_workspace

log = logging.getLogger(__name__)

RECOVERED = "[recovered: this command had already run; its recorded result is shown, it was not re-run]"
RUNNER_GRACE_SECONDS = 30.0
"""Beyond a bash call's own timeout (which the runner enforces), how long the worker waits for its answer."""
WHAT_SURVIVES = (
    "Files under /workspace survive (they live on the session's volume); running processes, /tmp, the bash "
    "working directory and exported variables do not. The next tool call starts a fresh container."
)


DEFAULT_DOCKER_ROOT = "/var/lib/docker"


def engine_task_queue(client: docker.DockerClient) -> str:
    """The queue of the workers attached to this engine: `corral-sandbox@<engine id>`, and for an engine whose data
    root is not the default one, `-<hash of that root>` after it. Docker 20.10 derives its engine id from the host's
    `/etc/docker/key.json`, so two daemons on one host report the same id, and calls for one engine's containers
    would reach the other's workers; two daemons on one host always have different data roots. An engine with the
    default root keeps the queue it always had, so the handles of running sessions stay valid."""
    queue = f"{SANDBOX_TASK_QUEUE}@{containers.engine_id(client)}"
    root = str(client.info().get("DockerRootDir") or DEFAULT_DOCKER_ROOT)
    if root != DEFAULT_DOCKER_ROOT:
        queue += f"-{hashlib.sha256(root.encode()).hexdigest()[:8]}"
    return queue


def signal_name(number: object) -> str:
    """`9 (SIGKILL)`, as a killed call's note names it; the number alone when it names no signal here."""
    try:
        return f"{number} ({signal.Signals(int(str(number))).name})"
    except ValueError:
        return str(number)


def _gone(exc: SandboxGone) -> ApplicationError:
    return ApplicationError(
        f"{exc}. {WHAT_SURVIVES}", type=SANDBOX_GONE, non_retryable=True, category=ApplicationErrorCategory.BENIGN
    )


class SandboxActivities:
    """Holds the Docker client and the default image; one instance per sandbox worker."""

    def __init__(
        self,
        client: docker.DockerClient,
        image: str,
        cluster_id: str = "",
        namespace: str = "default",
        git_proxy_port: int = DEFAULT_GIT_PROXY_PORT,
        blobs: BlobStore | None = None,
        pool: PoolSettings | None = None,
    ) -> None:
        self._docker = client
        self._blobs = blobs or open_blob_store()
        """Where a bash call's whole output goes when the model is shown only its head and tail."""
        self._image = image
        self._cluster_id = cluster_id
        self._git_proxy_port = git_proxy_port  # the worker's `CORRAL_GIT_PROXY_PORT`, read once at its start
        self.task_queue = engine_task_queue(client)
        self._runners = Runners(client)
        """One open stream per container to its resident runner, opened on the first call."""
        self.pool = WarmPool(client, image, f"{cluster_id}/{namespace}", self._runners, pool) if pool else None
        """Started sandboxes for first calls (None: off); whoever runs the workers runs `pool.maintain()`."""

    # ---- lifecycle --------------------------------------------------------------------------------------------

    @activity.defn(name=ACTIVITY_PROVISION_SANDBOX)
    async def provision_sandbox(self, input: ProvisionInput) -> SandboxHandle:
        """A warm pool member for a session's first container, else create (or restart) the session's container
        from its recipe; idempotent, so retries are safe."""
        scope = f"{self._cluster_id}/{input.namespace}"
        async with heartbeating():
            try:
                made = await self._from_pool(input)
                if made is None:
                    made = await asyncio.to_thread(
                        containers.ensure_container,
                        self._docker,
                        input.session_id,
                        input.environment,
                        input.generation,
                        self._image,
                        scope,
                        input.repositories,
                        self._git_proxy_port,
                        input.volume,
                    )
            except SandboxSetupError as exc:
                raise ApplicationError(str(exc), type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc
            if input.knowledge:
                await self._place(made.container_id, input)
        environment = input.environment
        warm = " (from the warm pool)" if made.from_pool else ""
        log.info("sandbox %s ready for %s%s", made.container_name, input.session_id, warm)
        return SandboxHandle(
            session_id=input.session_id,
            container_id=made.container_id,
            container_name=made.container_name,
            volume=made.volume,
            image=made.image,
            task_queue=self.task_queue,
            generation=input.generation,
            working_dir=environment.working_dir,
            bash_timeout_seconds=environment.bash_timeout_seconds,
            bash_max_timeout_seconds=environment.bash_max_timeout_seconds,
        )

    async def _place(self, container_id: str, input: ProvisionInput) -> None:
        """The session's files, skills and memory stores, under the container's `/mnt` (sandbox/knowledge.py)."""
        assert input.knowledge is not None
        try:
            await asyncio.to_thread(knowledge.place_knowledge, self._docker, container_id, self._blobs, input.knowledge,
                                    input.memory)  # fmt: skip
        except BlobNotFound as exc:
            raise ApplicationError(f"a file, skill or memory store of this session is gone from the blob store: {exc}",
                                   type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc  # fmt: skip
        except SandboxGone:
            raise  # the container went: provisioning again makes another
        except SandboxError as exc:  # a tar that failed in the container: the same again would fail again
            raise ApplicationError(f"the session's files, skills or memory stores could not be placed: {exc}",
                                   type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc  # fmt: skip

    async def _from_pool(self, input: ProvisionInput) -> containers.Provisioned | None:
        """A claimed pool member, for a session that has no workspace yet: on a network of the session's own and
        with its repositories cloned, when its recipe has them."""
        if self.pool is None or input.volume or pool_key(input.environment, self._image) is None:
            return None
        if await asyncio.to_thread(sessions.has_sandbox, self._docker, input.session_id, input.generation):
            return None  # a retry that made it already, or a workspace of the session's own (a fork's copy)
        name = sessions.container_name(input.session_id, input.generation)
        scope = f"{self._cluster_id}/{input.namespace}"
        environment, git_host = await asyncio.to_thread(
            containers.with_git_access, self._docker, input.environment, self._image, input.repositories
        )
        made = await self.pool.claim(f"{scope}/{name}", name, environment)
        activity.metric_meter().create_counter("corral_pool_claims", "Warm-pool claims, by result").add(
            1, {"result": "miss" if made is None else "hit"}
        )
        if made is not None and (environment.networking.type != "none" or input.repositories):
            await asyncio.to_thread(
                containers.settle_claimed, self._docker, made, input.session_id, environment, scope, self._image,
                input.repositories, git_host, self._git_proxy_port,
            )  # fmt: skip
        return made

    @activity.defn(name=ACTIVITY_COLLECT_KNOWLEDGE)
    async def collect_knowledge(self, input: CollectInput) -> Collected:
        """What the agent wrote to its outputs and its writable memory stores since the workflow last kept them
        (their bytes put in the blob store); nothing, if the container is gone (its `/mnt` went with it)."""
        try:
            outputs, stores = await asyncio.to_thread(knowledge.collect_knowledge, self._docker, self._blobs, input)
        except docker.errors.NotFound:
            return Collected()
        return Collected(outputs=outputs, memory=stores)

    @activity.defn(name=ACTIVITY_FORK_WORKSPACE)
    async def fork_workspace(self, input: ForkWorkspaceInput) -> bool:
        """Copy the source session's workspace for its fork; False when it is not on this worker's engine."""
        scope = f"{self._cluster_id}/{input.namespace}"
        labels = {sessions.SESSION_LABEL: input.session_id, sessions.SCOPE_LABEL: scope}
        source = await asyncio.to_thread(sessions.session_volume, self._docker, input.source_session_id)
        if source is None:
            return False
        target = sessions.volume_name(input.session_id)
        try:
            return await asyncio.to_thread(copy_workspace, self._docker, source, target, self._image, labels=labels)
        except SandboxSetupError as exc:
            raise ApplicationError(str(exc), type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc

    @activity.defn(name=ACTIVITY_STOP_SANDBOX)
    async def stop_sandbox(self, ref: SandboxRef) -> None:
        """Stop the container (zero compute while idle); the workspace volume stays."""
        await asyncio.to_thread(sessions.stop_container, self._docker, ref.handle.container_id)

    @activity.defn(name=ACTIVITY_RELEASE_SANDBOX)
    async def release_sandbox(self, ref: SandboxRef) -> None:
        """Remove every container of the session, and its volume when asked (the session ended)."""
        await asyncio.to_thread(sessions.remove_session, self._docker, ref.handle.session_id, ref.remove_volume)

    # ---- execute ----------------------------------------------------------------------------------------------

    @activity.defn(name=ACTIVITY_EXECUTE)
    async def execute(self, input: ExecuteInput) -> str:
        """`execute(name, input) -> string` for the built-in tools, in the session's container."""
        handle = input.sandbox
        if handle is None:
            raise tool_error(f"tool {input.name!r} needs a sandbox, and the call named none")
        model = SANDBOX_TOOL_INPUTS.get(input.name)
        if model is None:
            raise tool_error(f"unknown sandbox tool {input.name!r}")
        try:
            params = model.model_validate(input.input)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
            raise tool_error(f"invalid input for {input.name}: {problems}") from None
        async with heartbeating():
            try:
                if isinstance(params, BashInput):
                    return await self._bash(input.session_id, input.tool_use_id, params, handle, input.shell)
                return await self._file_tool(input.tool_use_id, input.name, params, handle)
            except SandboxGone as exc:
                raise _gone(exc) from exc
            except SandboxError as exc:
                raise tool_error(f"{input.name}: {exc}") from exc

    async def _ask(self, handle: SandboxHandle, op: str, wait: float | None = None, **fields: Any) -> dict[str, Any]:
        """One request to the container's resident runner; SandboxGone when the container died (or was removed).
        A stream that broke while the container runs on (the engine restarted its API) is opened again, once."""
        for attempt in (1, 2):
            try:
                return await self._runners.request(handle.container_id, op, wait, **fields)
            except RunnerLost:
                await asyncio.to_thread(running.get_running, self._docker, handle.container_id)
                if attempt == 2:
                    raise
            except TimeoutError:
                await asyncio.to_thread(running.get_running, self._docker, handle.container_id)
                raise SandboxError(f"the sandbox's runner did not answer within {wait:g}s") from None
        raise AssertionError("unreachable")

    async def _file_tool(self, call_id: str, name: str, params: BaseModel, handle: SandboxHandle) -> str:
        input = params.model_dump(exclude_none=True)
        answer = await self._ask(handle, "tool", call=call_id, tool=name, input=input, workdir=handle.working_dir)
        if not answer.get("ok"):
            raise tool_error(str(answer.get("output") or answer.get("error") or f"{name} failed"))
        return cut_output(str(answer.get("output", "")))

    async def _bash(
        self, session_id: str, call_id: str, params: BashInput, handle: SandboxHandle, shell: str | None
    ) -> str:
        notes: list[str] = []
        # A thread's calls name its own shell state; the session's own name none, so their requests stay as they were.
        named: dict[str, Any] = {"shell": shell} if shell is not None else {}
        if params.restart:
            if not params.command:
                reset = await self._ask(handle, "reset", **named)
                if not reset.get("ok", True) and reset.get("error"):
                    raise SandboxError(f"the sandbox's runner failed: {reset['error']}")
                return "bash session restarted: working directory and exported variables are reset"
            notes.append("[bash session restarted before this command]")
        if not params.command or not params.command.strip():
            raise tool_error("bash: command is required (or restart: true)")
        size = len(params.command.encode(errors="surrogatepass"))
        if size > containers.MAX_COMMAND_BYTES:
            raise tool_error(
                f"bash: the command is {size} bytes, over the limit of {containers.MAX_COMMAND_BYTES} bytes: put long "
                "content in a file with the write tool, then run it"
            )
        timeout = handle.bash_timeout_seconds
        if params.timeout_ms:
            timeout = params.timeout_ms / 1000
            if timeout > handle.bash_max_timeout_seconds:
                notes.append(f"[timeout lowered to the maximum of {handle.bash_max_timeout_seconds:g}s]")
                timeout = handle.bash_max_timeout_seconds
        request = {
            "call": call_id,
            "command": params.command,
            "workdir": handle.working_dir,
            "timeout": timeout,
            "head": OUTPUT_HEAD,
            "tail": OUTPUT_TAIL,
            "restart": bool(params.restart),
            **named,
        }
        try:
            # The runner times the command out itself; this wait only guards against a runner that hangs.
            answer = await self._ask(handle, "bash", timeout + RUNNER_GRACE_SECONDS, **request)
        except asyncio.CancelledError:  # an interrupt: kill the command's process group, then let the cancel through
            with contextlib.suppress(Exception):
                (await self._runners.stream(handle.container_id)).send_without_answer("kill", call=call_id)
            raise
        if not answer.get("ok", True) and answer.get("error"):
            raise SandboxError(f"the sandbox's runner failed: {answer['error']}")
        status, recovered = answer.get("status"), answer.get("recovered")
        if recovered:
            if status in ("lost", "killed") and not answer.get("timed_out"):
                notes.append(
                    "[outcome unknown: this command was started before, and it did not finish cleanly. It was NOT run "
                    "again. Check its effects (files, processes) before running it again.]"
                )
            else:
                notes.append(RECOVERED)
        if answer.get("timed_out"):
            notes.append(f"[timed out after {timeout:g}s: the command and its child processes were killed]")
        elif status == "killed" and not recovered:
            notes.append(f"[killed by signal {signal_name(answer.get('signal'))} before it finished]")
        elif status == "lost" and not recovered:  # never silent: an empty output would read as a success
            notes.append("[outcome unknown: the command's shell ended, and neither its exit code nor a signal was "
                         "recorded. Check its effects (files, processes) before running it again.]")  # fmt: skip
        return await self._bash_output(handle, session_id, call_id, answer, notes)

    async def _keep_whole_output(self, handle: SandboxHandle, session_id: str, call_id: str) -> str:
        """Copy a cut output whole to the blob store; what the marker adds to say where (nothing if it failed)."""
        try:
            container = await asyncio.to_thread(running.get_running, self._docker, handle.container_id)
            whole = await asyncio.to_thread(running.call_output_file, container, call_id)
            await asyncio.to_thread(self._blobs.put, tool_output_key(session_id, call_id), whole)
        except (SandboxError, BlobStoreError, OSError) as exc:
            log.warning("the whole output of %s in %s was not kept: %s", call_id, session_id, exc)
            return ""
        return f"; the whole output is kept: `corral output {session_id} {call_id}`"

    async def _bash_output(
        self, handle: SandboxHandle, session_id: str, call_id: str, answer: dict[str, Any], notes: list[str]
    ) -> str:
        text = str(answer.get("output", ""))
        if answer.get("cut_bytes"):
            kept = await self._keep_whole_output(handle, session_id, call_id)
            text += f"\n[output truncated: {answer['cut_bytes']} of {answer['total_bytes']} bytes cut{kept}]\n"
            text += str(answer.get("output_tail", ""))
            # Free the output's space now that it is kept whole: a retry reads the recorded head and tail.
            with contextlib.suppress(SandboxError):
                await self._ask(handle, "compact", call=call_id, head=OUTPUT_HEAD, tail=OUTPUT_TAIL)
        if answer.get("output_full"):
            notes.append(
                f"[output limit reached: the sandbox keeps at most {containers.OUTPUT_TMPFS_MB} MB of bash output "
                "at a time, and writing more failed with 'No space left on device'; redirect large output to a file]"
            )
        if answer.get("oom_kills"):
            limit = f" of {answer['memory_limit_mb']} MB" if answer.get("memory_limit_mb") else ""
            notes.append(
                f"[out of memory: the sandbox's memory limit{limit} was reached while this command ran, and the kernel "
                f"killed {answer['oom_kills']} process(es)]"
            )
        if answer.get("status") == "done" and answer.get("exit_code"):
            notes.append(f"[exit code {answer['exit_code']}]")
        return "\n".join(part for part in [text.rstrip("\n"), *notes] if part) or "(no output)"
