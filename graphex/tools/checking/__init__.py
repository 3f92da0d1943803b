"""`graphex check`: run the user's script in eager, record its custom-op calls, check each op on them.

record.py       run the script under a dispatch mode; keep each custom-op call's inputs, outputs, writes
values.py       tensors inside arguments: bind to schema names, clone, describe, compare
fake.py         checks 1, 2, 5: a fake exists, agrees with the real kernel, reads no data
mutation.py     checks 3, 4: writes match the schema; outputs do not alias inputs
graph.py        check 6: the op compiled with graphex gives eager's results; torch.library.opcheck
propose.py      a fake for an op that has none (or a wrong one): probe the kernel on varied shapes
shape_rules.py  the candidate shape/dtype rules, and the first that fits every probe
suite.py        which checks run on which recorded call, and what a failure skips
report.py       problems as text or JSON
"""

CHECKS = {  # name -> number, in the order they run
    "fake_exists": 1,
    "fake_matches": 2,
    "mutations_declared": 3,
    "no_output_alias": 4,
    "fake_reads_no_data": 5,
    "graph_matches_eager": 6,
}
