"""The sandbox: the environment recipe, the built-in toolset, and the handle the workflow keeps as data.

Persisted schemas: add optional fields, never repurpose one.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from corral.contract.grammar import workspace_path_problem
from corral.contract.knowledge import MemoryExport, SessionKnowledge
from corral.names import sandbox_engine_problem

SANDBOX_TOOL_NAMES = ("bash", "read", "write", "edit", "glob", "grep")
UNAVAILABLE_TOOL_NAMES = ("web_fetch", "web_search")
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:=<>~@/-]{0,127}$")


PermissionPolicyType = Literal["always_allow", "always_ask"]
"""`always_allow`: a call runs; `always_ask`: it waits for the client's `user.tool_confirmation`."""


def check_permission_policy(policy: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """Refuse a policy corral cannot run, saying why (`auto` needs a classifier that corral does not have)."""
    kind = None if policy is None else policy.get("type")
    if kind == "auto":
        raise ValueError(
            f"{where}: permission_policy 'auto' is not supported: corral has no classifier to decide which calls to "
            "ask about; use always_allow or always_ask"
        )
    if kind not in (None, "always_allow", "always_ask"):
        raise ValueError(f"{where}: permission_policy must be always_allow or always_ask, not {kind!r}")
    return policy


def policy_type(policy: dict[str, Any] | None, default: PermissionPolicyType = "always_allow") -> PermissionPolicyType:
    """The type of a (validated) policy, or `default` when none is set."""
    kind = None if policy is None else policy.get("type")
    return "always_ask" if kind == "always_ask" else "always_allow" if kind == "always_allow" else default


class ToolConfig(BaseModel):
    """Per-tool settings inside `agent_toolset_20260401`."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["bash", "read", "write", "edit", "glob", "grep", "web_fetch", "web_search"]
    enabled: bool | None = None
    permission_policy: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _policy(self) -> ToolConfig:
        check_permission_policy(self.permission_policy, f"configs[{self.name}]")
        return self


class ToolsetDefaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    permission_policy: dict[str, Any] | None = None

    @field_validator("permission_policy")
    @classmethod
    def _policy(cls, policy: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_permission_policy(policy, "default_config")


class AgentToolset20260401(BaseModel):
    """The built-in toolset, named as in the Managed Agents API; its tools run in the session's sandbox."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["agent_toolset_20260401"] = "agent_toolset_20260401"
    configs: list[ToolConfig] = Field(default_factory=list)
    default_config: ToolsetDefaultConfig | None = None

    @model_validator(mode="after")
    def _supported(self) -> AgentToolset20260401:
        for config in self.configs:
            if config.name in UNAVAILABLE_TOOL_NAMES and config.enabled:
                raise ValueError(f"{config.name} is not available in corral yet; the sandbox has no web tools")
        return self

    def permission(self, name: str) -> PermissionPolicyType:
        """A tool's policy: its own config's, else the toolset default's, else `always_allow`."""
        default = policy_type(self.default_config.permission_policy if self.default_config else None)
        return policy_type(next((c.permission_policy for c in self.configs if c.name == name), None), default)

    def enabled_names(self) -> list[str]:
        """Enabled sandbox tools: the default applies unless a config says otherwise (web tools stay off)."""
        default = self.default_config is None or self.default_config.enabled is not False
        explicit: dict[str, bool] = {c.name: c.enabled for c in self.configs if c.enabled is not None}
        return [name for name in SANDBOX_TOOL_NAMES if explicit.get(name, default)]


_HOST_PATTERN = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class Networking(BaseModel):
    """`none` (default): no network at all; `limited`: HTTP(S) through an allow-list proxy to `allowed_hosts`
    only (exact names, or `*.example.com`); `unrestricted`: the engine's bridge network."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["none", "limited", "unrestricted"] = "none"
    allowed_hosts: list[str] = Field(default_factory=list, max_length=200)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        cleaned = [host.strip().lower().rstrip(".") for host in hosts]
        bad = [host for host in cleaned if not _HOST_PATTERN.match(host)]
        if bad:
            raise ValueError(f"not a host name or *.domain pattern: {', '.join(repr(host) for host in bad)}")
        return sorted(set(cleaned))

    @model_validator(mode="after")
    def _hosts_only_when_limited(self) -> Networking:
        if self.type == "limited" and not self.allowed_hosts:
            raise ValueError("networking type 'limited' needs allowed_hosts (use 'none' for no network at all)")
        if self.type != "limited" and self.allowed_hosts:
            raise ValueError("allowed_hosts applies only to networking type 'limited'")
        return self


class Packages(BaseModel):
    """Packages installed on top of the sandbox image, once per distinct list (the derived image is cached)."""

    model_config = ConfigDict(extra="forbid")
    apt: list[str] = Field(default_factory=list)
    pip: list[str] = Field(default_factory=list)

    @field_validator("apt", "pip")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not _PACKAGE_NAME.match(name)]
        if bad:
            raise ValueError(f"invalid package name(s): {', '.join(repr(name) for name in bad)}")
        return sorted(set(names))

    def empty(self) -> bool:
        return not (self.apt or self.pip)


class ResourceLimits(BaseModel):
    """Limits applied to the sandbox container."""

    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(default=1.0, gt=0, le=64)
    memory_mb: int = Field(default=1024, ge=64, le=262_144)
    pids: int = Field(default=256, ge=16, le=65_536)
    tmp_mb: int = Field(default=256, ge=16, le=65_536)


class Environment(BaseModel):
    """The provision recipe of a session's sandbox. Validated before the session starts."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["docker"] = "docker"
    image: str | None = Field(default=None, description="default: the corral sandbox image built on this machine")
    packages: Packages = Field(default_factory=Packages)
    working_dir: str = "/workspace"
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    networking: Networking = Field(default_factory=Networking)
    idle_stop_seconds: float = Field(default=600, ge=5, le=7 * 24 * 3600)
    bash_timeout_seconds: float = Field(default=120, gt=0, le=24 * 3600)
    bash_max_timeout_seconds: float = Field(default=600, gt=0, le=24 * 3600)
    engine: str | None = Field(
        default=None,
        description="the sandbox engine pool: the workers started with CORRAL_SANDBOX_ENGINE=<engine> provision the "
        "sandbox (on their Docker engine); default: the workers of the default pool",
    )

    @field_validator("engine")
    @classmethod
    def _engine(cls, engine: str | None) -> str | None:
        problem = None if engine is None else sandbox_engine_problem(engine)
        if problem is not None:
            raise ValueError(problem)
        return engine

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, path: str) -> str:
        problem = workspace_path_problem(path, root_allowed=True)
        if problem is not None:
            raise ValueError(f"working_dir {problem}")
        return path

    @model_serializer(mode="wrap")
    def _without_default_engine(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An environment without an engine serializes exactly as before the field existed: its payloads (a session's
        # input, `provision_sandbox`'s) stay byte for byte the same, and workers that predate the field (which
        # forbids unknown fields) still read them during a rolling upgrade.
        data: dict[str, Any] = handler(self)
        if self.engine is None:
            data.pop("engine", None)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Environment:
        if self.bash_timeout_seconds > self.bash_max_timeout_seconds:
            raise ValueError("bash_timeout_seconds must not exceed bash_max_timeout_seconds")
        return self


class SandboxHandle(BaseModel):
    """What the workflow keeps about its sandbox: plain data, so replay never touches Docker."""

    session_id: str
    container_id: str
    container_name: str
    volume: str
    image: str
    task_queue: str
    """The queue of the workers attached to the engine that holds this container."""
    generation: int
    working_dir: str = "/workspace"
    bash_timeout_seconds: float = 120
    bash_max_timeout_seconds: float = 600


class ProvisionInput(BaseModel):
    """Input of `provision_sandbox`: make (or restart) this session's container from the recipe."""

    session_id: str
    environment: Environment
    generation: int
    namespace: str = "default"
    """Labels the container, so a reaper only judges the sessions of its own namespace."""
    repositories: list[RepositoryClone] = Field(default_factory=list)
    """Cloned into the workspace through the git proxy (no token enters the container)."""
    volume: str | None = None
    """The workspace volume the session's earlier containers had (None: a first container, or not recorded)."""
    knowledge: SessionKnowledge | None = None
    """Files, skills and memory stores to place under `/mnt` (corral.contract.knowledge); None: nothing."""
    memory: list[MemoryExport] = Field(default_factory=list)
    """The memory stores' contents as exported for this sandbox."""


class CollectInput(BaseModel):
    """Input of `collect_knowledge`: what the workflow knows is already kept, so only changes come back."""

    session_id: str
    sandbox: SandboxHandle
    outputs_seen: dict[str, str] = Field(default_factory=dict)
    """Output path -> sha256 of what is already a file."""
    memory: list[MemoryExport] = Field(default_factory=list)
    """Each writable store mounted, with the hashes of what it holds as far as the session knows."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """memory_store_id -> its mount path."""


class RepositoryClone(BaseModel):
    """What the sandbox worker needs to clone one repository: a proxy path, never a token."""

    repository_id: str
    reference: str
    mount_path: str
    checkout: str | None = None


class SandboxRef(BaseModel):
    """Input of `stop_sandbox` and `release_sandbox`."""

    handle: SandboxHandle
    remove_volume: bool = False


# ---- the built-in tools' inputs (validated in the sandbox activity) ---------------------------------------


class BashInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | None = None
    restart: bool | None = None
    timeout_ms: int | None = Field(default=None, ge=0)


class ReadInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file_path: str = Field(min_length=1)
    view_range: list[int] | None = Field(default=None, min_length=1, max_length=2)


class WriteInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file_path: str = Field(min_length=1)
    content: str = Field(max_length=512_000)


class EditInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file_path: str = Field(min_length=1)
    old_string: str
    new_string: str
    replace_all: bool | None = None


class GlobInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str = Field(min_length=1)
    path: str | None = None


class GrepInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str = Field(min_length=1)
    path: str | None = None


SANDBOX_TOOL_INPUTS: dict[str, type[BaseModel]] = {
    "bash": BashInput,
    "read": ReadInput,
    "write": WriteInput,
    "edit": EditInput,
    "glob": GlobInput,
    "grep": GrepInput,
}

SANDBOX_TOOL_DESCRIPTIONS: dict[str, str] = {
    "bash": "Run a bash command in the sandbox (working directory and exported variables persist between calls; "
    "timeout_ms sets a per-call timeout). Output is stdout and stderr combined.",
    "read": "Read a text file (relative paths are under /workspace); view_range [start, end] selects lines.",
    "write": "Write (overwrite) a whole file, creating parent directories.",
    "edit": "Replace old_string by new_string in a file; old_string must occur exactly once unless replace_all.",
    "glob": "List paths matching a glob pattern such as **/*.py, newest first.",
    "grep": "Search file contents for a regular expression (ripgrep), returning matching lines with numbers.",
}


def sandbox_tool_schema(name: str) -> dict[str, Any]:
    """The JSON schema the model sees for a built-in tool (a fresh copy: callers may change it)."""
    return copy.deepcopy(_sandbox_tool_schema(name))


@functools.cache
def _sandbox_tool_schema(name: str) -> dict[str, Any]:
    # Generating a JSON schema costs milliseconds; every session start and model turn needs these.
    schema = SANDBOX_TOOL_INPUTS[name].model_json_schema()
    schema.pop("title", None)
    for key, prop in list(schema.get("properties", {}).items()):
        prop.pop("title", None)
        options = [option for option in prop.pop("anyOf", []) if option.get("type") != "null"]
        if len(options) == 1:  # `X | None` reads as an optional X to the model, not as "X or null"
            prop.update(options[0])
            prop.pop("default", None)
        schema["properties"][key] = prop
    return schema


ProvisionInput.model_rebuild()


class ForkWorkspaceInput(BaseModel):
    """Input of the `fork_workspace` activity: copy a session's workspace volume for its fork."""

    source_session_id: str
    session_id: str
    namespace: str
