"""One rule for comparing runs: every compared number is computed over the training all compared runs reached.

A run's recall AUC is normalised over its own length, and its "final" recall is its last evaluation: compare a
run cancelled at 64 % of its steps with a finished one and both numbers compare different stretches of training
(a cancelled IDP-SGD run beside a finished INO-SGD run showed "+6.9 pp" where, over the steps both reached, the
gain was −0.1 pp). So the frames that compare runs (:mod:`engine.figures.frames`: owner recall and Pearson r,
recall gains, recall AUC, the final and fairness tables; through them the headline, the talk table, the
presentation pack, ``privacy-lab export`` and the experiment scripts) read each run only up to its limit here.

The rule, stated once:

* each run has *reached* the share of its planned steps of its last evaluation (a finished run: all of it); a run
  the user cancelled has reached its last evaluation at or before the step of the click (``cancel_step``: the steps
  its worker trained while the request reached it are never counted, also before the store drops them);
* the compared span is the smallest share any compared run reached: each run is read up to that share of its own
  plan (runs with the same plan: up to the same step);
* when a run is cut, the numbers carry it in words (:meth:`Span.words`): "over steps 0–900, which both runs
  reached; IDP-SGD #3 was cancelled at 64 %".

Evaluations are discrete: a run cut at share p keeps its evaluations at steps ≤ p · its plan, so runs on the same
evaluation grid are compared on the same steps. Histories (the curves over training) are not cut: they show each
run as far as it went.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from engine.figures import evidence as ev
from engine.jobs.runs import run_label

# how a run that stopped short is named in the span's words (any other status: its own name)
_STOPPED = {"running": "is still running", "queued": "is queued", "diverged": "diverged"}


def _step(e) -> int:
    return int(e.step if hasattr(e, "step") else e.get("step", 0))


def _last_step(run: dict) -> int | None:
    """The step of the run's last counted evaluation: its last one, or for a Cancel its last one at or before the
    click's step (None: none)."""
    evals = run.get("evals") or []
    stop = run.get("cancel_step")
    steps = [_step(e) for e in evals if stop is None or _step(e) <= stop]
    return steps[-1] if steps else None


def _reached(run: dict, last: int) -> tuple[int, float]:
    """(the run's planned step total, the share of it its last evaluation reached): a finished run, or one
    stored without a plan (nothing to measure it against), has reached all of it."""
    total = run.get("total_steps")
    if run.get("status") == "finished" or not total:
        return int(total or last or 1), 1.0
    return int(total), min(1.0, last / max(int(total), 1))


@dataclass(frozen=True)
class Span:
    """The stretch of training a comparison of runs reads: ``share`` of each run's plan, i.e. each run up to
    ``limits[run id]`` (its last compared step). ``short``: (label, status, share reached) of the runs that end
    the span (the ones that reached least); ``runs``: how many runs are compared; ``steps``: the plan they share
    (None when their plans differ)."""

    share: float = 1.0
    limits: dict = field(default_factory=dict)
    cut: tuple = ()
    short: tuple = ()
    runs: int = 0
    steps: int | None = None

    def limit(self, run_id) -> int | None:
        """The run's last compared step (None: no limit, read it all)."""
        return self.limits.get(run_id)

    def keep(self, frame: pd.DataFrame, run_column: str = "run_id", step_column: str = "step") -> pd.DataFrame:
        """The rows of a per-evaluation frame within the span (rows of runs without a limit all kept)."""
        if not self.cut or frame.empty:
            return frame
        limit = frame[run_column].map(self.limits)
        return frame[limit.isna() | (frame[step_column] <= limit)]

    def last(self, evals: list, run_id):
        """The last of a run's evaluation records (``step`` attributes) within the span; None before any."""
        limit = self.limit(run_id)
        for e in reversed(evals):
            if limit is None or e.step <= limit:
                return e
        return None

    def words(self) -> str | None:
        """The span in words when it cuts any run ("over steps 0–900, which both runs reached; IDP-SGD #3 was
        cancelled at 64 %"); None when every compared run is read to its end. Raw text (run labels as the user
        wrote them): figures escape it."""
        if not self.cut:
            return None
        who = "both runs" if self.runs == 2 else f"all {self.runs} runs"
        if self.steps is not None:
            end = min(self.limits.values())
            where = f"over steps 0–{end}, which {who} reached"
        else:
            where = f"over the first {100 * self.share:.0f} % of each run's planned steps, which {who} reached"
        stops = [f"{label} {_STOPPED.get(status, 'was ' + status)} at {100 * share:.0f} %"
                 for label, status, share in self.short]
        return where + ("; " + ", ".join(stops) if stops else "")


def common_span(runs: list[dict]) -> Span:
    """The span every number comparing ``runs`` (run records with their evaluations) is computed over: see the
    module's rule. Runs without evaluations take no part, and neither do reruns (:func:`engine.figures.evidence.
    reruns`: counted once, a rerun stopped short does not cut the comparison): each is read as far as its kept run."""
    rerun_of = ev.reruns(runs)
    reached = {}
    for run in ev.distinct(runs, rerun_of):
        last = _last_step(run)
        if last is None:
            continue
        total, share = _reached(run, last)
        reached[run["id"]] = (run, last, total, share)
    if not reached:
        return Span()
    share = min(v[3] for v in reached.values())
    totals = {v[2] for v in reached.values()}
    limits, cut = {}, []
    for run_id, (run, last, total, own) in reached.items():
        limit = last if own <= share else int(share * total + 1e-9)
        limits[run_id] = limit
        if limit < _step(run["evals"][-1]):  # (a cancelled run's evaluations after the click are cut too)
            cut.append(run_id)
    for rerun, kept in rerun_of.items():
        if kept in limits:
            limits[rerun] = limits[kept]
    short = tuple((run_label(v[0]), v[0].get("status", ""), v[3]) for v in reached.values()
                  if v[3] <= share and v[3] < 1.0) if cut else ()
    return Span(share=share, limits=limits, cut=tuple(cut), short=short, runs=len(reached),
                steps=totals.pop() if len(totals) == 1 else None)


def span_title(title: str, span: Span | None) -> str:
    """A comparison figure's title followed by its span in words ("Recall AUC — over steps 0–900, which …") when
    the span cuts a run (raw text: the figure builder escapes it; a narrow chart wraps it)."""
    words = span.words() if span is not None else None
    return title if words is None else f"{title} — {words}"
