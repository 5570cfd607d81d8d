"""``kernellab compare``: search strategies set against each other, with statistics, from the store alone.

Input: a study (``--study NAME``: the matrix ``kernellab study`` recorded) or a list of campaigns. A *run*
is one (campaign, problem); runs are grouped by strategy (policy, agents and prompt version: only the
parts that differ name a group), or ``--by policy|agents|prompts`` (an A/B of prompt and skill versions
groups by their content hash, over the same problems and seeds).

Definitions (the page's "method" section says the same):

- **best so far** after n evaluations: the best objective value among the run's counted evaluations so
  far: correct, kind ``full`` or a tuner ``retime``, a kernel win as bench counts one
  (``kernellab.vocab.counts_as_kernel_win``: not library-only, own-kernel share >= 0.5 on a GPU). Every evaluation
  the search spent (``trial`` rows included) advances n; winners' fresh-job re-timings do not (they
  check the selection). GPU-seconds are the sandbox's ``details.gpu_s``, summed.
- **objective**: the campaign's speedup (vs eager or torch.compile). Interpreted (CPU) runs have no
  speedup: their value is ``eager_ms / median_ms`` in the interpreter (curves and finals alike), labelled
  as such, and nothing on the page calls it a speedup; their pairs are not called wins or losses
  (interpreter timings are noise for that).
- **final**: the run's reported best (``store.reported_best``: the winner's fresh-job re-timing), when
  it counts as a kernel win; else the last best-so-far value.
- **normalized**: a value divided by the best any run of the comparison reached on that problem
  (finals by finals, curves by curves), so problems of different scale pool; 0 before the first
  counted correct candidate. **AUC**: the mean of the normalized best-so-far over evaluations
  1..H (H: the most evaluations any run made; a run that stopped early keeps its last value).
- **evaluations to 95%**: the first n at which the run's best so far reaches 95% of the best any run
  reached on that problem.
- **paired comparison** of A and B: pairs are (problem, seed) present in both; a pair is a tie when
  the normalized finals differ by at most ``tie`` (relative). The effect is the mean paired difference
  of normalized finals, with a percentile bootstrap interval that resamples *problems* (a problem's
  seeds stay together: they are not independent); the p-value is Wilcoxon's signed-rank test over the
  pairs (scipy), which treats the pairs as independent.
- **LLM cost per unit of gain**: the runs' tokens and dollars (``llm_calls``; a replayed call counts what
  the original cost) over the summed gain ``max(0, final - 1)``; never computed for interpreted runs.
- **failures**: the ``full`` evaluations that were not correct, by error class (else status).

numpy, scipy and matplotlib are imported inside the functions that use them.

The modules: ``runs`` (reading the store), ``stats`` (the statistics, :func:`compare`) and ``render`` (text,
JSON, the HTML page). This module only re-exports.
"""

from __future__ import annotations

from kernellab.compare.render import SECTIONS, render_html, to_json, to_text, write_html
from kernellab.compare.runs import GROUPINGS, CompareError, Run, collect, interpreted_ratio
from kernellab.compare.stats import analyze, compare

__all__ = ["CompareError", "Run", "collect", "analyze", "compare", "render_html", "write_html", "to_text", "to_json",
           "GROUPINGS", "SECTIONS", "interpreted_ratio"]
