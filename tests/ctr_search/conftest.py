"""Fixtures of the search tests: the tiny task of tests/cohorts/conftest.py, shared (not
copied), as ragged_test runs the cohort runner the way the search driver does."""

from tests.cohorts.conftest import data

__all__ = ["data"]
