"""Hands: anything behind `execute(name, input) -> string`, served as the `execute` activity on a task queue.

A team adds a hand (a browser, a device, an internal service) by running a worker that serves `execute` on a
queue of its own and declaring its tools with the agent as `{"type": "hand", "task_queue": ...}`.
"""

from corral.hands._execute import ToolFunction, make_execute_activity

__all__ = ["ToolFunction", "make_execute_activity"]
