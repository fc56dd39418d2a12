"""The engine of "the best LR along an axis", shared by ``search: horizon`` (token budgets) and ``search: width``
(model widths); not a search of its own. Its parts: the axis and each point's conclusion (axis.py: the points, the
runs at each, each point's located LR* and the search's fit through them), the stages that locate each point's LR*
and confirm the prediction at the target (search.py), the settings both share (settings.py), and what both reports
share (held_out.py: what the intervals held on held-out scenarios)."""
