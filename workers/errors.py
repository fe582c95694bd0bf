"""Errors of the workers, each raised before a worker serves (a start that cannot succeed) and reported on one line.

The hierarchy::

    SettingsError                a variable of the worker's environment is missing or malformed (workers.settings)
    WorkerStartError             a service the worker needs (Temporal, the Docker engine, Vault) did not answer
    DeploymentError              Temporal refused a change of the harness's Worker Deployment, or it was late

A bad setting exits with code 2, a failed start with code 1 (workers.run).
"""

from __future__ import annotations


class DeploymentError(Exception):
    """Temporal refused a change of the deployment, or it did not happen in time; the message says which."""


class WorkerStartError(Exception):
    """A service the worker needs (Temporal, the Docker engine, Vault) did not answer at start; says which."""


class SettingsError(Exception):
    """A variable of the worker's environment is missing or malformed; the message names it, on one line."""
