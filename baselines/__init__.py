"""Comparison models: rating predictors and dense imputers."""
