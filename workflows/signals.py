"""Signals a raw client sends with more arguments than a handler takes are dropped, not run.

The SDK decodes a signal's payloads and calls its handler with all of them: two arguments to a one-argument handler
raise TypeError inside the workflow task, which fails and is retried with the same signal, again and again (a
session wedged by one `temporal workflow signal --input a --input b`). Every corral signal takes at most one
argument; more is dropped with a warning, as a signal whose argument does not decode is (by the SDK).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.worker import (
    HandleSignalInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

MAX_SIGNAL_ARGS = 1


class SignalArgumentsInterceptor(Interceptor):
    """The harness worker's interceptor: see the module docstring."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _DropExtraArguments


class _DropExtraArguments(WorkflowInboundInterceptor):
    async def handle_signal(self, input: HandleSignalInput) -> None:
        if len(input.args) > MAX_SIGNAL_ARGS:
            workflow.logger.warning(
                "dropped a %s signal with %d arguments (it takes at most %d)",
                input.signal,
                len(input.args),
                MAX_SIGNAL_ARGS,
            )
            return
        await super().handle_signal(input)
