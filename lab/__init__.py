"""The research record: one folder per study (its arms, its results, its log) and the script that rebuilds
docs/results.md from them. Nothing in the product imports it."""
