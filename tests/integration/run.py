#!/usr/bin/python3
"""Runs unittest test classes for ctest: exit 0 passed, 1 failed, 77 when
every test skipped (ctest then reports the entry as skipped, with the
reasons printed above, instead of as a vacuous pass)."""
import sys
import unittest

SKIPPED = 77

if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromNames(sys.argv[1:])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun > 0 and len(result.skipped) == result.testsRun:
        for test, reason in result.skipped:
            print(f"skipped {test.id()}: {reason}")
        sys.exit(SKIPPED)
