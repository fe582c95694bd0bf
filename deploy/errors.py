"""Errors of the compose tool, in the sandbox package's tree (a build or an install that cannot be done here is a
setup error of this machine, as the sandbox image's are).

The hierarchy::

    sandbox.errors.SandboxSetupError
    ├── ComposeBuildError        an offline image could not be built: no engine, pip failed, or the engine refused
    └── sandbox.errors.PackageInstallError
        └── ComposeNotFound      no Compose could be found or installed; the message says what was tried

`deploy/openbao_entrypoint.py` has its own `BootstrapError`: it runs inside the OpenBao image, with the standard
library alone.
"""

from __future__ import annotations

from sandbox.errors import PackageInstallError, SandboxSetupError


class ComposeBuildError(SandboxSetupError):
    """An offline image could not be built: no engine, pip failed, or the engine refused a build (log named)."""


class ComposeNotFound(PackageInstallError):
    """No Compose could be found or installed; the message says what was tried."""
