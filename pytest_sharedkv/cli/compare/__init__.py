"""``python -m pytest_sharedkv compare BEFORE.json AFTER.json``: the pre-upgrade check.

One concern a module: ``reading`` (loading reports), ``schema`` (what a report must hold,
alike on both sides), ``correctness`` (every tier's correctness differences, ``finding``
their words; ``legacy`` reads records of older reports), ``speed`` (perf
verdicts, significance), ``flags`` (the engine settings two screenings ran with),
``placement`` (where the replicas ran: one GPU or one each), ``topology`` (one LMCache
server or one per replica over an L2), ``rendering`` (the Markdown
lines), ``main`` (the command line).

Correctness first: any failed or unfinished test, any VOID or CONFOUNDED result,
namespace leak, divergence, failed hit accounting, KV audit mismatch or PARTIAL pool hit in
AFTER, and any test that passed in BEFORE and did not pass in AFTER, fails the compare (new
ones, by test id, listed first). Records are judged by their kind and status (see
``report.records``), never by their message; records without them (reports written
before they existed) go to the legacy reader, which applies the old text rule.

Then speed: per cell (size x arm x step) the median TTFT, and per arm x
placement the median session wall time, with the observations and block pairs behind each
number and the relative change; a cell slower than ``--max-regression`` is a regression
when its block pairs also tell the change from noise (``significance.welch``, one-sided in
the change's direction; pyperf's ``compare_to`` judges the same way and prints "Not
significant"), else the verdict says "within noise" or "not judged" and the RESULT line
counts them, slower and faster: an A/A pair of H200 runs differs by 10-35% in some cells.
Only the arms both screenings ran are compared: an arm one side alone screened (NATIVE
merged into BEFORE's OFF-ON pairs) is named on an ARMS DIFFER line, not counted as
missing. Where the two screenings' engine settings differ (CUDA graphs or eager, KV cache, fp8, the
user's ``--sharedkv-vllm-args``), a FLAGS DIFFER line names them and speed cells are shown
but not judged as regressions, unless ``--allow-flag-change``; so where one screening ran
both replicas on one GPU and the other one per GPU (PLACEMENT DIFFERS), unless
``--allow-placement-change``; and where the topology or its L2 differs (TOPOLOGY DIFFERS),
unless ``--allow-topology-change``.

Exit status: 0 no difference, 1 a regression or a correctness difference, 2 a usage error
or reports that do not compare (another schema, model or corpus; a file that is missing,
not JSON, another tool's, or a report without what its schema holds; a ``--markdown``
that is an input, or exists without ``--force``). Bad input gets one line naming the file
or option, never a traceback.
"""
