"""Sandbox activities: provision, execute (the built-in tools), stop, release. Docker access, no credential.

`provision_sandbox` runs on the shared `corral-sandbox` queue and answers with a handle naming the queue of the
engine that holds the container (`corral-sandbox@<engine>`); every later call for that container goes there, so a
sandbox worker can live on another host (`DOCKER_HOST`) and several can share one engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import docker
from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.archive import tool_output_key
from corral.blobs import BlobStore, BlobStoreError, open_blob_store
from corral.contract.activities import ExecuteInput
from corral.contract.errors import SANDBOX_GONE, SANDBOX_UNAVAILABLE
from corral.contract.sandbox import (
    SANDBOX_TOOL_INPUTS,
    BashInput,
    ForkWorkspaceInput,
    ProvisionInput,
    SandboxHandle,
    SandboxRef,
)
from corral.hands.errors import tool_error
from corral.hands.heartbeat import heartbeating
from corral.hands.output import OUTPUT_HEAD, OUTPUT_TAIL, cut_output
from corral.names import (
    ACTIVITY_EXECUTE,
    ACTIVITY_FORK_WORKSPACE,
    ACTIVITY_PROVISION_SANDBOX,
    ACTIVITY_RELEASE_SANDBOX,
    ACTIVITY_STOP_SANDBOX,
    DEFAULT_GIT_PROXY_PORT,
    SANDBOX_TASK_QUEUE,
)
from corral.sandbox import containers
from corral.sandbox.containers import ALREADY_STARTED_EXIT
from corral.sandbox.errors import SandboxError, SandboxGone, SandboxSetupError
from corral.sandbox.workspace import copy_workspace

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
WHAT_SURVIVES = (
    "Files under /workspace survive (they live on the session's volume); running processes, /tmp, the bash "
    "working directory and exported variables do not. The next tool call starts a fresh container."
)


def engine_task_queue(client: docker.DockerClient) -> str:
    return f"{SANDBOX_TASK_QUEUE}@{containers.engine_id(client)}"


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
        git_proxy_port: int = DEFAULT_GIT_PROXY_PORT,
        blobs: BlobStore | None = None,
    ) -> None:
        self._docker = client
        self._blobs = blobs or open_blob_store()
        """Where a bash call's whole output goes when the model is shown only its head and tail."""
        self._image = image
        self._cluster_id = cluster_id
        self._git_proxy_port = git_proxy_port  # the worker's `CORRAL_GIT_PROXY_PORT`, read once at its start
        self.task_queue = engine_task_queue(client)

    # ---- lifecycle --------------------------------------------------------------------------------------------

    @activity.defn(name=ACTIVITY_PROVISION_SANDBOX)
    async def provision_sandbox(self, input: ProvisionInput) -> SandboxHandle:
        """Create (or restart) the session's container from its recipe; idempotent, so retries are safe."""
        async with heartbeating():
            try:
                made = await asyncio.to_thread(
                    containers.ensure_container,
                    self._docker,
                    input.session_id,
                    input.environment,
                    input.generation,
                    self._image,
                    f"{self._cluster_id}/{input.namespace}",
                    input.repositories,
                    self._git_proxy_port,
                )
            except SandboxSetupError as exc:
                raise ApplicationError(str(exc), type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc
        environment = input.environment
        log.info("sandbox %s ready for %s", made.container_name, input.session_id)
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

    @activity.defn(name=ACTIVITY_FORK_WORKSPACE)
    async def fork_workspace(self, input: ForkWorkspaceInput) -> bool:
        """Copy the source session's workspace for its fork; False when it is not on this worker's engine."""
        scope = f"{self._cluster_id}/{input.namespace}"
        labels = {containers.SESSION_LABEL: input.session_id, containers.SCOPE_LABEL: scope}
        source, target = containers.volume_name(input.source_session_id), containers.volume_name(input.session_id)
        try:
            return await asyncio.to_thread(copy_workspace, self._docker, source, target, self._image, labels=labels)
        except SandboxSetupError as exc:
            raise ApplicationError(str(exc), type=SANDBOX_UNAVAILABLE, non_retryable=True) from exc

    @activity.defn(name=ACTIVITY_STOP_SANDBOX)
    async def stop_sandbox(self, ref: SandboxRef) -> None:
        """Stop the container (zero compute while idle); the workspace volume stays."""
        await asyncio.to_thread(containers.stop_container, self._docker, ref.handle.container_id)

    @activity.defn(name=ACTIVITY_RELEASE_SANDBOX)
    async def release_sandbox(self, ref: SandboxRef) -> None:
        """Remove every container of the session, and its volume when asked (the session ended)."""
        await asyncio.to_thread(containers.remove_session, self._docker, ref.handle.session_id, ref.remove_volume)

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
                container = await asyncio.to_thread(containers.get_running, self._docker, handle.container_id)
                if isinstance(params, BashInput):
                    return await self._bash(container, input.session_id, input.tool_use_id, params, handle)
                return await self._file_tool(container, input.tool_use_id, input.name, params, handle)
            except SandboxGone as exc:
                raise _gone(exc) from exc
            except SandboxError as exc:
                raise tool_error(f"{input.name}: {exc}") from exc

    async def _file_tool(
        self, container: Any, call_id: str, name: str, params: BaseModel, handle: SandboxHandle
    ) -> str:
        request = {"tool": name, "input": params.model_dump(exclude_none=True)}
        answer = await asyncio.to_thread(containers.run_tool, container, call_id, request, handle.working_dir)
        if not answer.get("ok"):
            raise tool_error(str(answer.get("output", f"{name} failed")))
        return cut_output(str(answer.get("output", "")))

    async def _bash(
        self, container: Any, session_id: str, call_id: str, params: BashInput, handle: SandboxHandle
    ) -> str:
        notes: list[str] = []
        if params.restart:
            await asyncio.to_thread(container.exec_run, ["rm", "-f", "/run/corral/state/cwd", "/run/corral/state/env"])
            if not params.command:
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
        workdir = handle.working_dir
        if activity.info().attempt > 1:
            # A retry: the first attempt's worker may have started (or even finished) this command.
            status = await asyncio.to_thread(containers.run_tool, container, call_id, {"tool": "call_status"}, workdir)
            if status["status"] != "none":
                return await self._resume(container, session_id, call_id, status["status"], timeout, workdir, notes)
        exec_id, stdin = await asyncio.to_thread(
            containers.start_bash, self._docker, container, call_id, params.command, workdir
        )
        waiter = asyncio.ensure_future(asyncio.to_thread(containers.wait_bash, self._docker, exec_id, stdin))
        try:
            code = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            await self._kill(container, call_id, workdir, waiter)
            notes.append(f"[timed out after {timeout:g}s: the command and its child processes were killed]")
            return await self._output(container, session_id, call_id, workdir, notes)
        except asyncio.CancelledError:
            await self._kill(container, call_id, workdir, waiter)
            raise
        if code == ALREADY_STARTED_EXIT:
            return await self._resume(container, session_id, call_id, "running", timeout, workdir, notes)
        return await self._output(container, session_id, call_id, workdir, notes)

    async def _resume(
        self, container: Any, session_id: str, call_id: str, status: str, timeout: float, workdir: str, notes: list[str]
    ) -> str:
        """Finish a call an earlier attempt started: never run it again."""
        waited = 0.0
        while status == "running" and waited < timeout:
            await asyncio.sleep(POLL_SECONDS)
            waited += POLL_SECONDS
            answer = await asyncio.to_thread(containers.run_tool, container, call_id, {"tool": "call_status"}, workdir)
            status = answer["status"]
        if status == "running":
            await self._kill(container, call_id, workdir, None)
            notes.append(f"[timed out after {timeout:g}s: the command and its child processes were killed]")
        elif status == "lost":
            notes.append(
                "[outcome unknown: the sandbox worker was lost while this command ran, and it did not finish "
                "cleanly. It was NOT run again. Check its effects (files, processes) before running it again.]"
            )
        else:
            notes.append("[recovered: this command had already run; its recorded result is shown, it was not re-run]")
        return await self._output(container, session_id, call_id, workdir, notes)

    async def _keep_whole_output(self, container: Any, session_id: str, call_id: str) -> str:
        """Copy a cut output whole to the blob store; what the marker adds to say where (nothing if it failed)."""
        try:
            whole = await asyncio.to_thread(containers.call_output_file, container, call_id)
            await asyncio.to_thread(self._blobs.put, tool_output_key(session_id, call_id), whole)
        except (SandboxError, BlobStoreError, OSError) as exc:
            log.warning("the whole output of %s in %s was not kept: %s", call_id, session_id, exc)
            return ""
        return f"; the whole output is kept: `corral output {session_id} {call_id}`"

    async def _kill(self, container: Any, call_id: str, workdir: str, waiter: asyncio.Future[Any] | None) -> None:
        with contextlib.suppress(SandboxError):
            await asyncio.to_thread(containers.run_tool, container, call_id, {"tool": "kill_call"}, workdir)
        if waiter is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(waiter, 10)

    async def _output(self, container: Any, session_id: str, call_id: str, workdir: str, notes: list[str]) -> str:
        request = {"tool": "call_output", "head": OUTPUT_HEAD, "tail": OUTPUT_TAIL}
        answer = await asyncio.to_thread(containers.run_tool, container, call_id, request, workdir)
        text = str(answer.get("output", ""))
        if answer.get("cut_bytes"):
            kept = await self._keep_whole_output(container, session_id, call_id)
            text += f"\n[output truncated: {answer['cut_bytes']} of {answer['total_bytes']} bytes cut{kept}]\n"
            text += str(answer.get("output_tail", ""))
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
        # Free the output's space now that it is read (and kept whole): a retry reads the recorded head and tail.
        compact = {"tool": "compact_call", "head": OUTPUT_HEAD, "tail": OUTPUT_TAIL}
        with contextlib.suppress(SandboxError):
            await asyncio.to_thread(containers.run_tool, container, call_id, compact, workdir)
        return "\n".join(part for part in [text.rstrip("\n"), *notes] if part) or "(no output)"
