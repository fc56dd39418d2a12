"""What trained runs show, and what lmtune concludes from them: Ray-free and file-free, below both the sweep (whose
searches decide from it as trials end) and the report (which reads runs from a sweep's files and hands them here).

- ``runs``: a run as the analysis sees it (`Run`, its `Budget`, ASHA's rungs in tokens), ranking LRs at equal
  tokens and crowning the best LR with its seed spread;
- ``rungs``: ASHA's rung rule, the one rule trials and fused members share;
- ``bracket``: where training fails (the edge bracket) and whether a run confirms it;
- ``landscape``: the best LR's interval, its basin and the LRs where the loss degrades;
- ``conclusion``: all of it as one typed `Conclusion`;
- ``locate``: one budget's best LR located between grid points, with its interval;
- ``fit``: the weighted power law through several budgets' (or widths') located LRs, and its intervals.

Nothing here imports lmtune.sweep or lmtune.report (tests/test_layout.py holds it to that).
"""
