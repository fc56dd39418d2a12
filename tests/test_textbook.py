"""The textbook rule a horizon or width search's prediction must beat (lmtune.searches.textbook): the largest proxy's
best LR carried to the target as a careful user would without any search, and the one line the reports give it —
whether the prediction agrees with it within the prediction's interval, and that the rule cost nothing."""

from __future__ import annotations

import pytest

from lmtune.searches.textbook import PRIOR_BETA, agrees, horizon_rule, largest_below, rule_sentence, width_rule


def test_the_horizon_rule_scales_the_largest_budgets_best_by_the_ratio_to_the_prior_beta():
    rule = horizon_rule(0.0101, 165_888, 663_552)  # the built-in corpus at 4x: 0.0101 x 4^-0.3
    assert PRIOR_BETA == 0.3 and rule.lr == pytest.approx(0.0101 * 4 ** -0.3) and rule.proxy_lr == 0.0101


@pytest.mark.parametrize(("parametrization", "lr"), [("sp", 0.0045), ("mup", 0.009)])
def test_the_width_rule_divides_by_the_width_ratio_under_sp_and_keeps_the_lr_under_mup(parametrization, lr):
    assert width_rule(0.009, 128, 256, parametrization).lr == pytest.approx(lr)


def test_the_rule_is_carried_from_the_largest_proxy_below_the_target_with_a_best_lr():
    assert largest_below([(32, 0.06), (64, 0.03), (128, None), (256, 0.009)], 256) == (64, 0.03)
    assert largest_below([(256, 0.009)], 256) is None


def test_a_rule_inside_the_predictions_interval_agrees_and_the_line_says_it_cost_nothing():
    rule = width_rule(0.009, 128, 256, "sp")
    line = rule_sentence(rule, (0.0027, 0.0073), "the widest proxy")
    assert agrees(rule, (0.0027, 0.0073))
    assert "gives 0.0045 (0.009 at d_model 128 ÷ 2), inside the prediction's interval (0.0027–0.0073)" in line
    assert "the prediction agrees with it" in line
    assert "the rule cost nothing beyond the widest proxy's own LR search" in line


def test_a_rule_outside_the_predictions_interval_disagrees_and_the_line_says_so():
    rule = horizon_rule(0.0101, 165_888, 663_552)
    line = rule_sentence(rule, (0.001, 0.005), "the largest budget")
    assert not agrees(rule, (0.001, 0.005))
    assert "outside the prediction's interval (0.001–0.005): the two disagree" in line
    assert "agrees" not in line and "the rule cost nothing beyond the largest budget's own LR search" in line
