"""The MCP wiring: mltrace.mcp.tools' functions as the tools of an MCP server (the MCP SDK's
``MCPServer``), over one :class:`~mltrace.mcp.root.TrialRoot`.

Each tool's description is what an agent reads to choose and call it, so it says what the tool
answers, its bounds, and which tool to call first. Arguments are typed with their bounds (the
SDK publishes them in each tool's input schema and refuses a value outside them); an error
that mltrace raises (an MltraceError or an OSError: the value and the fix) reaches the agent as
a tool error with its message; anything else is a bug, which the SDK logs on stderr and reports
without details. Either way the server goes on. The SDK runs synchronous tools in worker
threads; one lock keeps the trials, which are not thread-safe, to one call at a time.

Imports the MCP SDK (the ``mcp`` extra); mltrace.mcp.command imports this module only when the
server starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from mltrace import __version__
from mltrace.exceptions import MltraceError
from mltrace.mcp import tools
from mltrace.mcp.root import TrialRoot

INSTRUCTIONS = """\
Reads mltrace (and smdebug) trials: the tensors a training job saved over its steps (weights,
gradients, activations, losses and their reductions), the results of rules run over them, and
the flight recorder's record of the steps before a NaN. Start with list_trials, then
describe_trial for a trial's tensors and steps; read_tensor for a tensor's values over steps;
read_rule_results for what rules found; diagnose for what went wrong. A trial is named by its
path relative to the server's root, as list_trials gives it. Non-finite values come back as
the strings "nan", "inf" and "-inf"."""

_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)

Trial = Annotated[str, Field(
    description="the trial's path relative to the server's root, as list_trials gives it "
                "('.' for the root itself); on an S3 root also an s3:// URI under it")]


class ServerTools:
    """The tools of one server, as methods (the SDK reads each one's name, arguments and
    docstring): each answers from ``root``, under one lock.

    Args:
        root: the root served.
    """

    def __init__(self, root: TrialRoot) -> None:
        self.root = root
        self._lock = threading.Lock()

    def _answer(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``call()``, one at a time; what mltrace raises becomes a ToolError, whose message
        the agent reads."""
        with self._lock:
            try:
                return call()
            except (MltraceError, OSError) as exc:
                raise ToolError(str(exc)) from exc

    def list_trials(
        self,
        max_trials: Annotated[int, Field(ge=1, le=tools.MAX_TRIALS,
                                         description="list at most this many trials")]
        = tools.DEFAULT_MAX_TRIALS,
    ) -> dict[str, Any]:
        """List the mltrace/smdebug trials under the server's root (up to four folder levels
        deep): each one's path relative to the root (the `trial` argument of the other tools),
        the number of complete steps saved, the last global step, the workers, whether training
        ended, and the steps per mode (TRAIN, EVAL, ...). Call this first."""
        return self._answer(lambda: tools.list_trials(self.root, max_trials))

    def describe_trial(
        self,
        trial: Trial,
        collection: Annotated[str | None, Field(
            description="list only the tensors of this collection, e.g. gradients")] = None,
        pattern: Annotated[str | None, Field(
            description="list only tensor names matching this regular expression (re.search), "
                        "e.g. '^gradient/' or 'loss'")] = None,
        max_tensors: Annotated[int, Field(ge=1, le=tools.MAX_TENSORS,
                                          description="list at most this many tensor names")]
        = tools.DEFAULT_MAX_TENSORS,
    ) -> dict[str, Any]:
        """Describe one trial: steps per mode (count, first, last), workers, whether training
        ended, its collections with their tensor counts, its tensor names (those of
        `collection` and/or matching `pattern`, at most `max_tensors`, with the number left
        out), the flight recorder's first non-finite tensor and dumps, and which rules have
        stored results with their latest status. Use the tensor names with read_tensor."""
        return self._answer(lambda: tools.describe_trial(self.root, trial, collection, pattern,
                                                   max_tensors))

    def read_tensor(
        self,
        trial: Trial,
        name: Annotated[str, Field(description="the tensor name, as describe_trial lists it")],
        statistic: Annotated[str | None, Field(
            description="one statistic per step: mean, min, max, std, l1, l2, nan_count, "
                        "inf_count, abs_max, ... or value (a one-element tensor's own value); "
                        "left out: what each step has")] = None,
        mode: Annotated[str, Field(
            description="whose steps: GLOBAL (global steps, every mode), TRAIN, EVAL or "
                        "PREDICT (that mode's own step numbers)")] = "GLOBAL",
        start_step: Annotated[int | None, Field(description="first step (inclusive)")] = None,
        end_step: Annotated[int | None, Field(description="last step (inclusive)")] = None,
        max_points: Annotated[int, Field(ge=1, le=tools.MAX_POINTS,
                                         description="at most this many steps, thinned evenly")]
        = tools.DEFAULT_MAX_POINTS,
        worker: Annotated[str | None, Field(
            description="whose data in a distributed trial (default: each step's first worker)")]
        = None,
    ) -> dict[str, Any]:
        """Read a tensor's values over steps: `steps`, their `global_steps`, and `values` per
        statistic aligned with them. A loss or metric gives its `value`; a larger tensor its
        stored reductions, or min, max, mean, std, l1, l2, nan_count and inf_count of its raw
        value, or only `statistic`. At most `max_points` steps, thinned evenly with the first
        and last kept (a `note` says so); narrow with start_step/end_step. NaN and infinities
        are the strings "nan", "inf", "-inf"."""
        return self._answer(lambda: tools.read_tensor(self.root, trial, name, statistic, mode, start_step,
                                                end_step, max_points, worker))

    def read_rule_results(
        self,
        trial: Trial,
        rule: Annotated[str | None, Field(
            description="only this rule's results, e.g. VanishingGradient")] = None,
        max_results: Annotated[int, Field(ge=1, le=tools.MAX_RESULTS,
                                          description="at most this many, the latest")]
        = tools.DEFAULT_MAX_RESULTS,
    ) -> dict[str, Any]:
        """Read the rule results stored in a trial (each execution of a rule such as
        VanishingGradient or LossNotDecreasing over it): status (IssuesFound, NoIssuesFound,
        NothingChecked, Error), message, parameters, steps evaluated, the steps where the rule
        fired and the first of them, and the error if it failed; the latest `max_results`,
        oldest first."""
        return self._answer(lambda: tools.read_rule_results(self.root, trial, rule, max_results))

    def diagnose(
        self,
        trial: Trial,
        step: Annotated[int | None, Field(
            description="diagnose at this global step (default: over the whole run)")] = None,
    ) -> dict[str, Any]:
        """Diagnose a trial with mltrace's diagnosis: what looks wrong in the training run
        (non-finite values, for one), in which tensor and at which step, and what to do, over
        the whole run or at `step`. Call it first when a run failed or diverged, then
        read_tensor and read_rule_results to look closer."""
        return self._answer(lambda: tools.diagnose(self.root, trial, step))


def create_server(root: TrialRoot) -> MCPServer:
    """An MCP server whose tools read the trials of ``root``; run it with ``.run("stdio")``."""
    server: MCPServer = MCPServer("mltrace", instructions=INSTRUCTIONS, version=__version__)
    served = ServerTools(root)
    for tool in (served.list_trials, served.describe_trial, served.read_tensor,
                 served.read_rule_results, served.diagnose):
        server.add_tool(tool, annotations=_READ_ONLY)
    return server
