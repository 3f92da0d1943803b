"""The parts of `graphex triage` (graphex/tools/triage.py), one job per file:

runner.py     run the user's script, observed: what was compiled, its
              options, the inputs of its first call, what it raised; Dynamo's logs collected
observe.py    how torch.compile calls and the calls of what they return are seen (Python's
              profiling hook; nothing replaced)
state.py      every tensor a call can change (objects passed in, module state, globals),
              saved before the first call and put back before each rerun
dynamo_logs.py  the graph-break and recompile log records, tagged with the user's call site
breaks.py     graph breaks: every break of each compiled function (re-traced with
              fullgraph=False when the script stopped at the first), with a fix per reason
recompiles.py recompiles: the guard that failed, and the fix for that kind of guard
capture.py    what graphex refused (CaptureError, CustomOpError, other errors) and the
              copies it kept where an in-place update could not be applied
bisect.py     accuracy: eager vs aot_eager vs graphex force_eager vs graphex replay
schemas.py    the custom op whose schema lies, when the passes change the result
compare.py    bitwise / tolerance comparison of two runs' outputs and mutated inputs
report.py     the text report and the JSON document
findings.py   the Finding record every analysis returns
"""
