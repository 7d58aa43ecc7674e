"""One transport abstraction: ``Host`` with exec/put/get/close; one module per backend."""

from orchestrator.transport.base import ExecResult, Host

__all__ = ["ExecResult", "Host"]
