"""Errors of the sandbox package.

The hierarchy, so callers catch exactly as much as they mean to::

    SandboxError
    ├── SandboxSetupError        this machine cannot give sandboxes yet (raised before any session needs one)
    │   ├── PackageInstallError  apt-get could not install a host package (docker.io, debootstrap)
    │   ├── DockerEngineError    no Docker engine answers, and none could be started here
    │   └── SandboxImageError    the sandbox image could not be built
    ├── SandboxGone              a session's container died or was removed underneath it (the activities tell the
    │                            model what survived; the session goes on with a fresh container)
    └── RunnerLost               the stream to a container's runner ended before the answer came (ask again on a
                                 new one)

A setup error's message says what to do next and names the log file that holds the detail; no message carries
a secret.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by `sandbox`."""


class SandboxSetupError(SandboxError):
    """The Docker engine or the sandbox image is not available and could not be made available."""


class PackageInstallError(SandboxSetupError):
    """A host package could not be installed with apt-get (not root, no apt, or apt failed)."""


class DockerEngineError(SandboxSetupError):
    """No Docker engine answers, and none could be started on this machine."""


class SandboxImageError(SandboxSetupError):
    """The sandbox image could not be built (debootstrap, import or the Dockerfile layer failed)."""


class SandboxGone(SandboxError):
    """The session's container is gone or stopped underneath us (killed, OOM, engine restarted, removed)."""


class RunnerLost(SandboxError):
    """The stream to the runner ended before the answer came (the caller may open a new one and ask again)."""
