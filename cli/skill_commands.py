"""`corral skills`: a workspace's skills from a terminal, on the local knowledge database and blob store (the ones
`corral up` gives its gateway and workers, under --state-dir), through the library the API uses (corral.skills).

Every command names the workspace (`--workspace`): the CLI holds no API key, so it acts as the operator does.
`create` and `add-version` take a skill's folder (SKILL.md at its root) and check it exactly as the API does.
`create` with stdout captured prints the skill's id alone, so `SKILL=$(corral skills create ./csv-summary -w w)`
works.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from cli.app import app
from cli.context import CliError, Settings, fail, settings_of

if TYPE_CHECKING:
    from corral.skills import Skills

skills_app = typer.Typer(name="skills", help="Skills: folders with a SKILL.md that agents list and sessions place.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(skills_app, rich_help_panel="The gateway")

Workspace = Annotated[
    str, typer.Option("--workspace", "-w", help="The workspace the skills are in.", show_default=False)
]
SkillId = Annotated[str, typer.Argument(metavar="SKILL", help="The skill's id (skill_…).", show_default=False)]
Folder = Annotated[
    Path,
    typer.Argument(metavar="DIR", help="The skill's folder, with SKILL.md at its root.", show_default=False),
]


def _skills() -> Skills:
    """The library on the stack's knowledge database and blob store: under --state-dir, unless
    `CORRAL_KNOWLEDGE_DB` and `CORRAL_BLOB_STORE` name others (cli/app.py sets them for every command)."""
    from corral.blobs import open_blob_store
    from corral.knowledge_db import open_knowledge_db
    from corral.skills import Skills

    return Skills(open_knowledge_db(), open_blob_store())


def read_folder(folder: Path) -> list[tuple[str, bytes]]:
    """The folder's files as the SDK's `files_from_dir` sends them: paths from the folder's parent, `/`-separated.
    Links to directories are not followed (a loop would never end)."""
    if not folder.is_dir():
        raise CliError(f"{folder} is not a directory", hint="give the skill's folder, the one that holds SKILL.md")
    files = []
    for root, directories, names in os.walk(folder):
        directories.sort()
        for name in sorted(names):
            path = Path(root) / name
            files.append((path.relative_to(folder.parent).as_posix(), path.read_bytes()))
    return files


def _files(settings: Settings, folder: Path) -> list[tuple[str, bytes]]:
    try:
        return read_folder(folder)
    except CliError as error:
        fail(settings, error)


def _refused(settings: Settings, error: Exception) -> NoReturn:
    """A library refusal as the CLI reports it: its message, and an exit code of 2 for a folder that is not a
    skill's (the caller's input), 1 otherwise."""
    from corral.errors import InvalidSkillBundle, SkillNotFound

    if isinstance(error, SkillNotFound):
        fail(settings, CliError(str(error), hint="`corral skills ls -w WORKSPACE` lists the workspace's skills"))
    if isinstance(error, InvalidSkillBundle):
        fail(settings, CliError(f"not a skill's folder: {error}", exit_code=2))
    fail(settings, CliError(str(error)))


@skills_app.command("create")
def create(
    ctx: typer.Context,
    folder: Folder,
    workspace: Workspace,
    display_name: Annotated[str | None, typer.Option(help="A label (default: SKILL.md's name).")] = None,
) -> None:
    """Make a skill from a folder; the folder becomes its first version."""
    from corral.errors import SkillError

    settings = settings_of(ctx)
    files = _files(settings, folder)
    try:
        skill, version = _skills().create(workspace, files, display_name)
    except SkillError as exc:
        _refused(settings, exc)
    if not settings.stdout_is_terminal:
        print(skill.id)
    settings.human.print(f"made skill {skill.id} ({skill.display_name}), version {version.id}")


@skills_app.command("add-version")
def add_version(ctx: typer.Context, skill_id: SkillId, folder: Folder, workspace: Workspace) -> None:
    """Add a version from a folder (its SKILL.md keeps the skill's name); it becomes the latest."""
    from corral.errors import SkillError

    settings = settings_of(ctx)
    files = _files(settings, folder)
    try:
        version = _skills().add_version(workspace, skill_id, files)
    except SkillError as exc:
        _refused(settings, exc)
    if not settings.stdout_is_terminal:
        print(version.id)
    settings.human.print(f"added version {version.id} to {skill_id}: it is the latest")


@skills_app.command("ls")
def ls(ctx: typer.Context, workspace: Workspace) -> None:
    """List the workspace's skills, newest first."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe

    settings = settings_of(ctx)
    skills, _ = _skills().list_skills(workspace, limit=1000)
    if not skills:
        settings.out.print(f"no skills in workspace {workspace}")
        return
    table = Table()
    for column in ("id", "name", "display name", "latest version", "updated"):
        table.add_column(column, no_wrap=column in ("id", "latest version"))
    for skill in skills:
        table.add_row(Text(skill.id), Text(skill.name), Text(safe(skill.display_name)), Text(skill.latest_version),
                      local_time(skill.updated_at))  # fmt: skip
    settings.out.print(table)


@skills_app.command("versions")
def versions(ctx: typer.Context, skill_id: SkillId, workspace: Workspace) -> None:
    """List a skill's versions, newest (the latest) first."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe
    from corral.errors import SkillError

    settings = settings_of(ctx)
    try:
        found, _ = _skills().versions(workspace, skill_id, limit=1000)
    except SkillError as exc:
        _refused(settings, exc)
    table = Table()
    for column in ("version", "name", "description", "files", "bytes", "created"):
        table.add_column(column, no_wrap=column == "version")
    for version in found:
        table.add_row(Text(version.id), Text(version.name), Text(safe(version.description)),
                      str(version.file_count), str(version.size_bytes), local_time(version.created_at))  # fmt: skip
    settings.out.print(table)


@skills_app.command("download")
def download(
    ctx: typer.Context,
    skill_id: SkillId,
    workspace: Workspace,
    version: Annotated[str, typer.Argument(metavar="[VERSION]", help="A version id, or latest.")] = "latest",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write the zip (default: ./<name>.zip).")
    ] = None,
) -> None:
    """Write a version's folder as a zip archive (`<name>/SKILL.md`, …), as the API's download does."""
    from corral.errors import SkillError
    from corral.skill_bundles import bundle_zip

    settings = settings_of(ctx)
    try:
        found, files = _skills().content(workspace, skill_id, version)
    except SkillError as exc:
        _refused(settings, exc)
    target = output or Path(f"{found.name}.zip")
    if target.exists():
        fail(settings, CliError(f"{target} exists: nothing was written", hint="name another path with -o"))
    target.write_bytes(bundle_zip(found.name, files))
    settings.human.print(f"wrote {found.name} version {found.id} ({len(files)} files) to {target}")


@skills_app.command("rm")
def rm(
    ctx: typer.Context,
    skill_id: SkillId,
    workspace: Workspace,
    version: Annotated[str | None, typer.Option(help="Delete only this version (not the skill's only one).")] = None,
) -> None:
    """Delete a skill with all its versions, or one version of it."""
    from corral.errors import SkillError

    settings = settings_of(ctx)
    skills = _skills()
    try:
        if version is None:
            skills.delete(workspace, skill_id)
            settings.human.print(f"deleted skill {skill_id} and all its versions")
        else:
            deleted = skills.delete_version(workspace, skill_id, version)
            settings.human.print(f"deleted version {deleted.id} of {skill_id}")
    except SkillError as exc:
        _refused(settings, exc)
