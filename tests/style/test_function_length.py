#!/usr/bin/env python3
"""scripts/check-function-length: no product function is over 100 lines,
and the check measures what it says it does (so it cannot pass vacuously)."""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check-function-length")
loader = importlib.machinery.SourceFileLoader("check_function_length", SCRIPT)
spec = importlib.util.spec_from_loader("check_function_length", loader)
check = importlib.util.module_from_spec(spec)
loader.exec_module(check)


def function(name, body_lines, signature_lines=1):
    """A function of `signature_lines` + `body_lines` + 1 lines."""
    if signature_lines == 1:
        signature = [f"int {name}(int a) {{"]
    else:
        signature = ([f"int {name}(int a,"] + ["    int b,"] * (signature_lines - 2) +
                     ["    int c) {"])
    return "\n".join(signature + ["  a += 1;"] * body_lines + ["}"])


class TheTree(unittest.TestCase):
    def test_has_no_function_over_100_lines(self):
        result = subprocess.run([sys.executable, SCRIPT, ROOT], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("none over 100 lines", result.stdout)


class TheMeasure(unittest.TestCase):
    def test_counts_from_the_signature_to_the_closing_brace(self):
        self.assertEqual(check.functions(function("F", 98)), [(1, 100, "F")])
        self.assertEqual(check.functions(function("G", 3, signature_lines=3)), [(1, 7, "G")])

    def test_braces_in_strings_comments_and_characters_do_not_count(self):
        text = "\n".join(['void F() {', '  const char* s = "}}}";', "  char c = '}';",
                          "  // }", "}", "void G() {", "}"])
        self.assertEqual(check.functions(text), [(1, 5, "F"), (6, 2, "G")])

    def test_a_long_function_fails_the_check_naming_it(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "agent"))
            with open(os.path.join(root, "agent", "long.cc"), "w") as f:
                f.write(function("Fits", 98) + "\n\n" + function("TooLong", 99) + "\n")
            result = subprocess.run([sys.executable, SCRIPT, root], capture_output=True,
                                    text=True, timeout=60)
            self.assertEqual(result.returncode, 1)
            self.assertIn("agent/long.cc:102: TooLong is 101 lines, over 100", result.stderr)
            self.assertNotIn("Fits", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
