"""A sweep's trials as the report reads them, and what they conclude: below the searches, so that a search's part of
the report (lmtune.searches.NAME.report) builds on it and on nothing of the report's or the sweep's.

- ``stability``: each trial as the report reads it (`TrialRecord`), its status, and the edge reading;
- ``comparison``, ``rows``: runs compared at equal tokens, sensitivity, convergence, stage accounting; a trial's row;
- ``baselines``: what a search's tokens are priced against (a grid as fine as its bracket, a competent user's grid by
  hand, a careful user's grid under ASHA);
- ``summary``: what the runs conclude, typed (`SweepSummary`), and what the records add (`SweepFacts`);
- ``sharpness``: a trial's sharpness as the report records it (lmtune.report.sharpness estimates it);
- ``text``: numbers in words;
- ``part``: what a search's part of the report is given (`SweepInputs`, `FigureInputs`) and returns, and the common
  report (`PlainSection`).

Reading the sweep's folder (lmtune.report.reader) and writing the report (lmtune.report.writer) sit above the sweep;
nothing here imports lmtune.sweep, lmtune.searches or lmtune.report (tests/test_layout.py holds it to that).
"""
