#!/usr/bin/env python3
"""scripts/check-layers: the tree keeps its layers, and each rule catches
what breaks it (so the check cannot pass vacuously)."""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check-layers")
loader = importlib.machinery.SourceFileLoader("check_layers", SCRIPT)
spec = importlib.util.spec_from_loader("check_layers", loader)
layers = importlib.util.module_from_spec(spec)
loader.exec_module(layers)


def violations(path, text):
    return [rule for _, rule in layers.check_file(path, text)]


class TheTree(unittest.TestCase):
    def test_keeps_its_layers(self):
        result = subprocess.run([sys.executable, SCRIPT, ROOT], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("files keep the layers", result.stdout)


class EachRuleCatches(unittest.TestCase):
    def assert_caught(self, path, text, *words):
        found = violations(path, text)
        self.assertEqual(len(found), 1, (path, text, found))
        for word in words:
            self.assertIn(word, found[0])

    def test_rules_include_no_grpc_clock_thread_or_syscall(self):
        for header, word in [("<grpcpp/grpcpp.h>", "gRPC"), ('"proto/rendezvous.grpc.pb.h"', "gRPC"),
                             ('"absl/time/clock.h"', "a clock"), ("<chrono>", "a clock"),
                             ('"common/clock.h"', "a clock"), ("<thread>", "threads"),
                             ('"absl/synchronization/mutex.h"', "locks"),
                             ("<unistd.h>", "syscall"), ("<sys/random.h>", "syscall"),
                             ("<fstream>", "a file"),
                             ('"rendezvous/server/hub.h"', "other than rules/")]:
            self.assert_caught("rendezvous/rules/state.cc", f"#include {header}\n", word)

    def test_rules_call_no_clock_or_syscall(self):
        self.assert_caught("rendezvous/rules/state.cc", "int f() { return absl::Now() > x; }\n",
                           "a clock")
        self.assert_caught("rendezvous/rules/state.cc",
                           "auto t = std::chrono::steady_clock::now();\n", "a clock")
        self.assert_caught("rendezvous/rules/text.cc", "void f() { getrandom(b, 16, 0); }\n",
                           "a syscall")
        # Words in comments and strings are not calls.
        self.assertEqual(violations("rendezvous/rules/state.cc",
                                    '// absl::Now() is the caller\'s\nconst char* s = "open(";\n'), [])

    def test_rules_may_use_time_values_and_their_own_headers(self):
        self.assertEqual(violations("rendezvous/rules/state.h",
                                    '#include "absl/time/time.h"\n'
                                    '#include "rendezvous/rules/text.h"\n'
                                    '#include "proto/rendezvous.pb.h"\n'), [])

    def test_client_reaches_no_server_or_etcd(self):
        self.assert_caught("rendezvous/client/client.cc", '#include "rendezvous/server/hub.h"\n',
                           "without the server")
        self.assert_caught("rendezvous/client/client.h", '#include "rendezvous/etcd/keys.h"\n',
                           "without the server")

    def test_auth_and_grpc_sit_below_the_rest(self):
        self.assert_caught("rendezvous/auth/token.cc", '#include "rendezvous/client/client.h"\n',
                           "below")
        self.assert_caught("rendezvous/grpc/status.cc", '#include "rendezvous/server/hub.h"\n',
                           "below")

    def test_etcd_runs_without_the_server(self):
        self.assert_caught("rendezvous/etcd/leader.cc", '#include "rendezvous/server/hub.h"\n',
                           "without musterd's server")

    def test_agent_and_musterctl_use_the_client(self):
        self.assert_caught("agent/agent.cc", '#include "rendezvous/server/service.h"\n',
                           "rendezvous/client/")
        self.assert_caught("ctl/musterctl.cc", '#include "rendezvous/etcd/client.h"\n',
                           "rendezvous/client/")

    def test_host_mode_has_one_entry(self):
        self.assert_caught("launcher/run.cc", '#include "rendezvous/server/service.h"\n',
                           "hosted.h")
        self.assertEqual(violations("launcher/run.cc", '#include "rendezvous/server/hosted.h"\n'),
                         [])
        self.assertEqual(violations("rendezvous/server/musterd.cc",
                                    '#include "rendezvous/server/service.h"\n'), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
