"""`--trace FILE.jsonl`: one JSON object per round (`write`), read back (`read`), and
summarized (`summary`); this package is the door, the names below are its interface.

Schema ``specgen.trace`` version 1 (documented in the README). One object per line, each
with a ``type``:

- ``header`` (first line): ``schema``, ``version``, ``command``, ``target``, ``draft``,
  ``sampling`` {temp, top_k, top_p, min_p}, ``seed``, ``max_tokens``, ``created`` (UTC ISO
  8601) and any extra keys the command adds.
- ``generation`` (optional; `TraceWriter.begin`): ``generation`` (0-based index) and the
  settings of the generation that follows when a file holds several (``bench --trace``):
  ``sampling``, ``seed``, ``k`` and any extra keys.
- ``prefill``: ``generation``, ``n_prompt``, ``prefill_s``, ``ordinary_token_s`` (median
  single-token target pass, or null). Starts a new generation unless ``begin`` just did.
- ``round``: ``generation``, ``round`` (0-based within the generation), ``position``
  (committed tokens before the round), ``k``, ``drafted`` [ids], ``drafted_text``, ``q_x``,
  ``p_x`` (q_i(x_i), p_i(x_i); one-hot 1/0 values when greedy), ``u`` (the uniforms of the
  test u_i < p_i(x_i)/q_i(x_i); empty when greedy), ``accepted`` [bool per tested proposal,
  stopping at the first rejection], ``n_accepted``, ``next_token``, ``next_text``,
  ``next_kind`` ("residual", "bonus" or "ordinary"; traces of earlier versions may hold
  "none", a probe round with no bonus position, with ``next_token`` null), ``top``
  [{token, text, p}: the target's 3 most likely tokens where ``next_token`` was drawn,
  i.e. at the rejection point; when greedy, p is the softmax at
  temperature 1], ``emitted_text``, ``draft_s``,
  ``verify_s``, ``sample_s``, ``round_s``, ``target_cache``, ``draft_cache``,
  ``verify_rule`` ("token" or "block": under block verification ``u`` holds the uniforms
  eta_i of the test eta_i < h_i, ``h`` the h_i, and ``accepted`` is true for x_1..x_tau),
  ``sources`` [the proposer of each drafted token: "draft" (the draft model), "lookup"
  (prompt lookup), "prediction" (prompt lookup in a predicted output) or "grammar" (a
  token the grammar forced: no draft pass, and no target row where the grammar allowed
  it alone)], ``n_drafted_by`` and ``n_accepted_by``
  ({source: count}, counted as the stats are).
- ``end`` (last line of a finished generation): ``generation``, ``finish_reason``,
  ``n_generated``, ``stats``.

The output tokens of a generation are, round by round, ``drafted[:n_accepted] +
[next_token]`` (without a null ``next_token``), concatenated and cut to ``n_generated``
(nothing after an end-of-generation token, a stop string or -n is emitted):
`reconstruct_tokens` does it.

Files are streamed: each object is written as one complete line and flushed, so an
interrupted run (Ctrl-C, a crash) leaves a valid prefix with no ``end`` line, which
`summarize` reports as incomplete.
"""

from __future__ import annotations

from specgen.trace.read import (
    Generation,
    TopToken,
    TraceEnd,
    TraceFile,
    TracePrefill,
    TraceRound,
    read_trace,
    reconstruct_tokens,
)
from specgen.trace.summary import (
    LOSS_MARGIN_DEFAULT,
    LOSS_MARGIN_MIN,
    LostRound,
    PositionAcceptance,
    RejectedToken,
    TraceSummary,
    loss_margin,
    summarize,
)
from specgen.trace.write import SCHEMA, VERSION, TokenText, TraceWriter, tee, token_text_of

__all__ = [
    "LOSS_MARGIN_DEFAULT",
    "LOSS_MARGIN_MIN",
    "SCHEMA",
    "VERSION",
    "Generation",
    "LostRound",
    "PositionAcceptance",
    "RejectedToken",
    "TokenText",
    "TopToken",
    "TraceEnd",
    "TraceFile",
    "TracePrefill",
    "TraceRound",
    "TraceSummary",
    "TraceWriter",
    "read_trace",
    "reconstruct_tokens",
    "summarize",
    "tee",
    "loss_margin",
    "token_text_of",
]
