"""Test support shared by the suites (never imported by product code)."""
