"""Workflows turn a task into experiences. ``WORKFLOWS`` maps names to classes."""

from trivium.workflows.registry import WORKFLOWS, get_workflow, register_workflow

__all__ = ["WORKFLOWS", "get_workflow", "register_workflow"]
