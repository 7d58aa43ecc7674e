"""Central verdicts: leaks across hosts, tool-call shapes, the flip table and the decision table.

``analyse_run(run_dir, gate=None) -> RunReport`` is the entry point; ``RunReport`` serialises to
``report.json`` (docs/verdicts.md).
"""

from orchestrator.analysis.models import ACTIONS, PRECEDENCE, RunReport, TaskReport
from orchestrator.analysis.run import analyse_run

__all__ = ["ACTIONS", "PRECEDENCE", "RunReport", "TaskReport", "analyse_run"]
