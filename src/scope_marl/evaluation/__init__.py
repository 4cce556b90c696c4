"""Evaluation: held-out simulator panels, reward intervals, pass^k, policy entropy, diversity, reports."""
