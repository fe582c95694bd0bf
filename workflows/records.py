"""`RecordWorkflow`: one durable, versioned object (an agent, an environment, a vault, an API key...).

The workflow id is the object's id; its history is the object's change log, and Temporal visibility lists objects
by their search attributes (CorralKind, CorralWorkspace, CorralArchived). Every write is an update whose validator
refuses what must not be written (a stale version, a write to an archived or deleted record), so a refused write
leaves no trace in history. No I/O here: time comes from `workflow.now()`.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, VersioningBehavior
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.records import (
        ARCHIVED,
        DELETED,
        MAX_UPDATES_PER_RUN,
        NO_SUCH_VERSION,
        QUERY_GET,
        QUERY_VERSIONS,
        RECORD_WORKFLOW,
        UPDATE_ARCHIVE,
        UPDATE_DELETE,
        UPDATE_PUT,
        VERSION_CONFLICT,
        PutRecord,
        RecordCarry,
        RecordInput,
        RecordVersion,
        RecordView,
    )
    from corral.contract.search_attributes import ARCHIVED_KEY, KIND_KEY, WORKSPACE_KEY


@workflow.defn(name=RECORD_WORKFLOW)
class RecordWorkflow:
    """One object's versions, archive mark and deletion; it runs until the object is deleted."""

    @workflow.init
    def __init__(self, input: RecordInput) -> None:
        self._input = input
        if input.carry is not None:
            self._versions = list(input.carry.versions)
            self._archived_at = input.carry.archived_at
        else:
            now = workflow.now()
            self._versions = [RecordVersion(version=1, body=input.body, created_at=now, updated_at=now)]
            self._archived_at = None
        self._deleted = False
        self._updates = 0

    @workflow.run
    async def run(self, input: RecordInput) -> None:
        self._upsert_search_attributes()
        await workflow.wait_condition(lambda: self._deleted or self._run_is_long())
        # Handlers are synchronous, so none is left half-done here; waiting says so to the SDK all the same.
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._deleted:
            return
        carry = RecordCarry(versions=self._versions, archived_at=self._archived_at)
        workflow.continue_as_new(RecordInput(kind=input.kind, workspace=input.workspace, body=self._current.body,
                                             carry=carry))  # fmt: skip

    def _run_is_long(self) -> bool:
        return self._updates >= MAX_UPDATES_PER_RUN or workflow.info().is_continue_as_new_suggested()

    def _upsert_search_attributes(self) -> None:
        """Set what the start call did not (a start from the `temporal` CLI, say), and the archive mark."""
        current = workflow.info().typed_search_attributes
        wanted: list[tuple[SearchAttributeKey[str], str]] = [
            (KIND_KEY, self._input.kind),
            (WORKSPACE_KEY, self._input.workspace),
            (ARCHIVED_KEY, "true" if self._archived_at is not None or self._deleted else "false"),
        ]
        changes = [key.value_set(value) for key, value in wanted if current.get(key) != value]
        if changes:
            workflow.upsert_search_attributes(changes)

    # ---- writes ---------------------------------------------------------------------------------------------

    @workflow.update(name=UPDATE_PUT)
    def put(self, input: PutRecord) -> RecordView:
        """A new version with `input.body`; a body equal to the current one is no change and keeps the version."""
        self._updates += 1
        if input.body != self._current.body:
            now = workflow.now()
            self._versions.append(
                RecordVersion(version=self._current.version + 1, body=input.body, created_at=now, updated_at=now)
            )
        return self._view(self._current)

    @put.validator
    def _validate_put(self, input: PutRecord) -> None:
        self._check_writable()
        current = self._current.version
        if input.expected_version is not None and input.expected_version != current:
            raise ApplicationError(
                f"version {input.expected_version} is not the current version ({current})", type=VERSION_CONFLICT
            )

    @workflow.update(name=UPDATE_ARCHIVE)
    def archive(self) -> RecordView:
        """Mark the record archived (again: no change). It stays readable and listable with include_archived."""
        self._updates += 1
        if self._archived_at is None:
            self._archived_at = workflow.now()
            self._current.updated_at = self._archived_at
            self._upsert_search_attributes()
        return self._view(self._current)

    @archive.validator
    def _validate_archive(self) -> None:
        if self._deleted:
            raise ApplicationError("the record is deleted", type=DELETED)

    @workflow.update(name=UPDATE_DELETE)
    def delete(self) -> None:
        """Mark the record deleted; the workflow then completes, so it leaves every listing of running records."""
        self._updates += 1
        self._deleted = True
        self._upsert_search_attributes()

    @delete.validator
    def _validate_delete(self) -> None:
        if self._deleted:
            raise ApplicationError("the record is deleted", type=DELETED)

    def _check_writable(self) -> None:
        if self._deleted:
            raise ApplicationError("the record is deleted", type=DELETED)
        if self._archived_at is not None:
            raise ApplicationError("the record is archived: it can no longer change", type=ARCHIVED)

    # ---- reads ----------------------------------------------------------------------------------------------

    @workflow.query(name=QUERY_GET)
    def get(self, version: int | None = None) -> RecordView:
        """The current version, or `version` (a failed query of type `NO_SUCH_VERSION` when there is none)."""
        if version is None:
            return self._view(self._current)
        if not 1 <= version <= len(self._versions):
            raise ApplicationError(f"no version {version}", type=NO_SUCH_VERSION)
        return self._view(self._versions[version - 1])

    @workflow.query(name=QUERY_VERSIONS)
    def versions(self) -> list[RecordView]:
        """Every version, oldest first."""
        return [self._view(version) for version in self._versions]

    @property
    def _current(self) -> RecordVersion:
        return self._versions[-1]

    def _view(self, version: RecordVersion) -> RecordView:
        return RecordView(
            id=workflow.info().workflow_id,
            kind=self._input.kind,
            workspace=self._input.workspace,
            version=version.version,
            body=version.body,
            created_at=self._versions[0].created_at,
            updated_at=version.updated_at,
            archived_at=self._archived_at,
            deleted=self._deleted,
        )


@workflow.defn(name=RECORD_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class VersionedRecordWorkflow(RecordWorkflow):
    """`RecordWorkflow` as a versioned harness runs it (workers/deployment.py): a record moves to each new build at
    its next update, whatever the deployment's policy for sessions, because a pinned record, mostly idle, would
    keep its build alive forever. So change `RecordWorkflow` with `workflow.patched` only. (An unversioned worker
    refuses a workflow that names a versioning behavior: hence a class of its own.)"""

    @workflow.run
    async def run(self, input: RecordInput) -> None:
        await super().run(input)
