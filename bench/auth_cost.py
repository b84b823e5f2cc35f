#!/usr/bin/python3
"""What authentication costs, against none, same run; and musterd's memory
under junk jobs.

  bench/auth_cost.py [--muster PATH] [--musterd PATH] [--flood PATH]
                     [--modes none,token,tls,munge] [--runs 5] [--agents 16] [--joins 10000]

For each mode (none: no credential; token: --rdzv-conf token_file= and
musterd --token-file; tls: the token over TLS, certificates made here with
openssl; munge: Slurm's munge, against a munged of its own key that this
starts (as root) and stops; agents with auth=munge, musterd --munge):
  - restart latency, 2 agents on loopback, the agent that hosts the
    rendezvous serving in that mode (bench/multinode.py's measure);
  - start-up of --agents agents until every worker runs (the same);
  - --joins one-node jobs joined one after the other on one connection
    against musterd in that mode (tests/tools/rdzv-flood), in joins/s.
Each figure is the median of --runs, with the ratio to none's.

Then musterd's RSS under two waves of 10,000 junk jobs (joins of a two-node
job that give up after 0.5 s, leaving an empty job behind), with
--max-join-timeout 2s: before, after each wave, and after each wave is
forgotten.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import multinode  # noqa: E402

SERVING = re.compile(r"serving rendezvous on (\S+):(\d+)")


def token_file(directory):
    path = os.path.join(directory, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    return path


def certificates(directory):
    """ca.pem, and server.pem/key (127.0.0.1) signed by it, made by openssl."""
    ca = ("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 "
          "-subj /CN=bench-ca -keyout ca.key -out ca.pem")
    leaf = ("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=bench "
            "-keyout server.key -out server.csr && printf 'subjectAltName=IP:127.0.0.1\\n' > "
            "server.ext && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
            "-CAcreateserial -days 1 -extfile server.ext -out server.pem && chmod 600 server.key")
    subprocess.run(f"({ca}) && ({leaf})", shell=True, cwd=directory, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {name: os.path.join(directory, name) for name in ("ca.pem", "server.pem", "server.key")}


def private_munged(directory):
    """Starts a munged of its own key on DIRECTORY/munge.sock (as root, as the
    tests do); stop_munged() ends it. Returns the socket."""
    key = os.path.join(directory, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    socket = os.path.join(directory, "munge.sock")
    subprocess.run(["/usr/sbin/munged", f"--key-file={key}", f"--socket={socket}",
                    f"--pid-file={directory}/munged.pid", f"--log-file={directory}/munged.log",
                    f"--seed-file={directory}/munged.seed", "--force"], check=True)
    pid_file = os.path.join(directory, "munged.pid")
    for _ in range(500):
        if os.path.exists(socket) and os.path.exists(pid_file):
            break
        time.sleep(0.01)
    with open(pid_file) as f:
        MUNGEDS.append(int(f.read().strip()))
    return socket


MUNGEDS = []  # pids of the munged this started


def stop_munged():
    while MUNGEDS:
        try:
            os.kill(MUNGEDS.pop(), 15)
        except OSError:
            pass


def mode_setup(mode, directory):
    """(agents' --rdzv-conf, musterd's flags, rdzv-flood's flags) for a mode."""
    if mode == "none":
        return "", [], []
    if mode == "munge":
        socket = private_munged(directory)
        return (f"auth=munge,munge_socket={socket}", ["--munge", "--munge-socket", socket],
                ["--munge", "--munge-socket", socket])
    token = token_file(directory)
    if mode == "token":
        return f"token_file={token}", ["--token-file", token], ["--token-file", token]
    if mode == "tls":
        c = certificates(directory)
        return (f"token_file={token},cacert={c['ca.pem']},cert={c['server.pem']},"
                f"key={c['server.key']}",
                ["--token-file", token, "--tls-cert", c["server.pem"], "--tls-key",
                 c["server.key"]],
                ["--token-file", token, "--cacert", c["ca.pem"]])
    sys.exit(f"auth_cost.py: unknown mode {mode}")


class Musterd:
    def __init__(self, musterd, flags, directory):
        self.err = open(os.path.join(directory, "musterd.err"), "w")
        self.proc = subprocess.Popen([musterd, "--listen", "127.0.0.1", "--port", "0", *flags],
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        match = SERVING.search(line)
        if not match:
            self.proc.kill()
            sys.exit(f"musterd did not start: {line}")
        self.port = int(match.group(2))

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.err.close()


def flood(path, port, flags, *args):
    result = subprocess.run([path, "--target", f"127.0.0.1:{port}", *flags, *args],
                            capture_output=True, text=True, timeout=600)
    seconds = None
    for line in result.stdout.splitlines():
        fields = line.split("\t")
        if fields[0] == "seconds":
            seconds = float(fields[1])
    if result.returncode != 0 or seconds is None:
        sys.exit(f"rdzv-flood failed: {result.stdout}{result.stderr}")
    return seconds


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--flood",
                        default=os.path.join(ROOT, "build", "tests", "tools", "rdzv-flood"))
    parser.add_argument("--modes", default="none,token,tls,munge")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--joins", type=int, default=10000)
    parser.add_argument("--log-dir", default="/tmp/muster-auth-cost",
                        help="where the agents of the latest restart run log, per mode")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if modes[0] != "none":
        modes.insert(0, "none")

    figures = {}
    with tempfile.TemporaryDirectory(prefix="muster-auth-") as d:
        for mode in modes:
            directory = os.path.join(d, mode)
            os.makedirs(directory)
            conf, musterd_flags, flood_flags = mode_setup(mode, directory)
            # The agents' logs of the latest run stay in --log-dir, to read if one hangs.
            log_dir = os.path.join(args.log_dir, mode)
            os.makedirs(log_dir, exist_ok=True)
            restart = median(
                multinode.restart_run("muster", args.muster, conf=conf, log_dir=log_dir)[0]
                for _ in range(args.runs))
            start = median(multinode.startup("muster", args.muster, args.agents, conf=conf)
                           for _ in range(args.runs))
            server = Musterd(args.musterd, musterd_flags, directory)
            try:
                joins = median(args.joins / flood(args.flood, server.port, flood_flags, "--jobs",
                                                  str(args.joins), "--prefix", f"run{i}",
                                                  "--per-connection", "1")
                               for i in range(args.runs))
            finally:
                server.stop()
            figures[mode] = (restart, start, joins)

        print(f"authentication cost, median of {args.runs} runs each, same run")
        print(f"  {'mode':6} {'restart':>10} {'ratio':>6} {f'{args.agents} agents':>11} "
              f"{'ratio':>6} {f'{args.joins} joins':>14} {'ratio':>6}")
        base = figures["none"]
        for mode, (restart, start, joins) in figures.items():
            print(f"  {mode:6} {restart:8.1f} ms {restart / base[0]:6.2f} {start:8.1f} ms "
                  f"{start / base[1]:6.2f} {joins:10.0f} /s {joins / base[2]:6.2f}")

        directory = os.path.join(d, "junk")
        os.makedirs(directory)
        server = Musterd(args.musterd, ["--max-join-timeout", "2s"], directory)
        try:
            rss = [("start", server.rss_mib())]
            for wave in (1, 2):
                flood(args.flood, server.port, [], "--jobs", "10000", "--prefix", f"wave{wave}",
                      "--min-nodes", "2", "--connections", "50", "--per-connection", "16",
                      "--timeout", "0.5", "--join-timeout-ms", "600000", "--expect", "4")
                rss.append((f"wave {wave}: 10,000 junk jobs made", server.rss_mib()))
                time.sleep(4)  # their 2 s max join timeout, and the timer's turn
                rss.append((f"wave {wave}: forgotten", server.rss_mib()))
        finally:
            server.stop()
        print("musterd RSS under junk jobs (--max-join-timeout 2s)")
        for what, mib in rss:
            print(f"  {what:32} {mib:7.1f} MiB")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_munged()
