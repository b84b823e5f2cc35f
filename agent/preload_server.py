# The preloaded interpreter of --preload (agent/preload.h): started once per
# node by the agent, with the interpreter and flags its workers use, it
# imports the named modules and then only forks. Each fork becomes one
# worker, made what a cold `python -u script.py args` would make, and runs
# the user's script in this process's place. Nothing here may start a
# thread or touch a GPU: a fork copies only the thread that calls it.
#
# argv: this file, the socket's fd, the script (or -m and a module), then
# the modules to import. The agent sends requests on the socket (a stream):
# an 8-byte length with three fds (the worker's stdout, stderr, report), then
# NUL-separated fields: argc, argv..., envc, env..., the CPUs ("0,1" or ""),
# the memory nodes, the number of the set_mempolicy system call on this
# machine (the agent's header knows it). The report pipe gets the worker's pid from the middle
# process of a double fork, then EOF when the worker is set up; or "error: ".
import os
import signal
import socket
import struct
import sys

AGENT = os.getppid()
OUR_FILE = __file__
LIBC = None
# What a stop of the whole job sends (Slurm signals every process of the
# step): the interpreter outlives it, ending with the agent (PDEATHSIG, or
# its socket closing), and each worker gets back the handler it had.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
SAVED_HANDLERS = {}
# A cold start's __main__ has __annotations__ on some Pythons, not others.
MAIN_HAS_ANNOTATIONS = "__annotations__" in globals()


def libc():
    global LIBC
    if LIBC is None:
        import ctypes
        LIBC = ctypes.CDLL(None, use_errno=True)
    return LIBC


def is_archive_or_directory(script):
    import zipfile
    return os.path.isdir(script) or zipfile.is_zipfile(script)


def set_path0(script, module):
    """sys.path[0] as a cold start sets it: none with -P (PYTHONSAFEPATH)."""
    if getattr(sys.flags, "safe_path", False):
        return
    if module:
        sys.path[0] = os.getcwd()
    elif is_archive_or_directory(script):
        sys.path[0] = os.path.abspath(script)  # its __main__.py runs
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(script))


def thread_count():
    return len(os.listdir("/proc/self/task"))


def unusable():
    """Why forking this interpreter would not give what a cold start gives; "" if nothing."""
    threads = thread_count()
    if threads != 1:
        return f"it runs {threads} threads (an imported module started them)"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "it made a CUDA context (an imported module initialised CUDA)"
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            return f"it holds {target} open (an imported module opened the GPU)"
    return ""


def recv_request(sock):
    """(fields, fds), or None at EOF (the agent is gone)."""
    header, fds, got = b"", [], False
    while len(header) < 8:
        data, ancillary, _, _ = sock.recvmsg(8 - len(header), socket.CMSG_SPACE(3 * 4))
        if not data:
            return None
        header += data
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4]))
                got = True
    (size,) = struct.unpack("<Q", header)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            return None
        body += chunk
    if not got or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise RuntimeError("a request came without its three fds")
    return bytes(body).split(b"\0"), fds


def parse(fields):
    argc = int(fields[0])
    argv = [os.fsdecode(a) for a in fields[1:1 + argc]]
    rest = fields[1 + argc:]
    envc = int(rest[0])
    env = rest[1:1 + envc]
    cpus, nodes, set_mempolicy = rest[1 + envc:4 + envc]
    as_ints = lambda text: [int(x) for x in text.split(b",") if x]
    return argv, env, as_ints(cpus), as_ints(nodes), int(set_mempolicy)


def serve(sock):
    """Forks a worker per request; returns in the worker, with what it runs."""
    while True:
        got = recv_request(sock)
        if got is None:
            os._exit(0)
        fields, (out_fd, err_fd, report_fd) = got
        why = unusable()
        if why:
            os.write(report_fd, f"error: {why}".encode())
            for fd in (out_fd, err_fd, report_fd):
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:
            worker = os.fork()
            if worker != 0:
                # The worker is reparented to the agent (a child subreaper)
                # as this process ends: the agent is its parent, as for a
                # cold start, and reaps it.
                os.write(report_fd, f"{worker}\n".encode())
                os._exit(0)
            sock.close()
            return fields, out_fd, err_fd, report_fd
        for fd in (out_fd, err_fd, report_fd):
            os.close(fd)
        os.waitpid(middle, 0)


def become_worker(fields, out_fd, err_fd, report_fd):
    """Makes this process what a cold start of the worker would be; returns
    the worker's argv (the interpreter's, flags and all)."""
    for sig, handler in SAVED_HANDLERS.items():
        signal.signal(sig, handler)
    os.setpgid(0, 0)
    import time
    deadline = time.monotonic() + 2  # for the middle process to end
    while os.getppid() != AGENT and time.monotonic() < deadline:
        time.sleep(0.0001)
    c = libc()
    c.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, now that the agent is the parent
    if os.getppid() != AGENT:
        os.write(report_fd, b"error: the agent is not the worker's parent")
        os._exit(127)
    c.prctl(0x59616D61, AGENT)  # PR_SET_PTRACER: the agent's stack tools may attach
    argv, env, cpus, nodes, set_mempolicy = parse(fields)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in (out_fd, err_fd):
        if fd > 2:
            os.close(fd)
    reopen_standard_streams()
    # Best effort, as for a cold start: a worker that runs unbound still runs.
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    if nodes:
        import ctypes
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        mask = (ctypes.c_ulong * (max(nodes) // bits + 1))()
        for node in nodes:
            mask[node // bits] |= 1 << (node % bits)
        # MPOL_PREFERRED_MANY (5); kernels before 5.15: MPOL_PREFERRED (1), the first node.
        if c.syscall(set_mempolicy, 5, mask, len(mask) * bits + 1) != 0:
            first = (ctypes.c_ulong * 1)(1 << nodes[0]) if nodes[0] < bits else None
            if first is not None:
                c.syscall(set_mempolicy, 1, first, bits + 1)
    os.environb.clear()
    for entry in env:
        key, _, value = entry.partition(b"=")
        if key:
            os.environb[key] = value
    # A fresh random state, as after exec (random reseeds itself at fork).
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        numpy.random.seed()
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = argv
    return argv


def reopen_standard_streams():
    """An agent started with stdout or stderr closed gives this interpreter
    none (sys.stdout is None); the worker has its pipes: streams on them, as
    python -u makes them."""
    import io
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        if getattr(sys, name) is None:
            stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), errors=errors,
                                      write_through=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def without_our_frames(hook):
    """sys.excepthook, showing the traceback a cold start shows: without
    the frames of this file that the worker's code runs under."""
    def excepthook(kind, value, tb):
        while tb is not None and tb.tb_frame.f_code.co_filename == OUR_FILE:
            tb = tb.tb_next
        if isinstance(value, BaseException):
            value.__traceback__ = tb
        hook(kind, value, tb)
    return excepthook


def run_script(argv):
    import runpy
    at = 1  # past the interpreter's flags
    while argv[at].startswith("-"):
        at += 1
    sys.argv = argv[at:]
    script = sys.argv[0]
    set_path0(script, False)
    if is_archive_or_directory(script):
        fresh_main()
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as source:
            text = source.read()
    except OSError as error:
        sys.stderr.write(f"{argv[0]}: can't open file {path!r}: "
                         f"[Errno {error.errno}] {error.strerror}\n")
        sys.exit(2)
    code = compile(text, path, "exec", dont_inherit=True)
    import importlib.machinery
    main = fresh_main()
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    exec(code, main.__dict__)


def fresh_main():
    """A __main__ module as an interpreter starts with, in this file's
    place: runpy runs -m modules in it, and the worker's code must not see
    this file's names."""
    import builtins
    import types
    main = types.ModuleType("__main__")
    main.__spec__ = None
    main.__package__ = None
    main.__builtins__ = builtins
    if MAIN_HAS_ANNOTATIONS:
        main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def run_module(argv):
    import runpy
    sys.argv = argv[argv.index("-m") + 1:]  # runpy makes [0] the module's file
    set_path0(None, True)
    fresh_main()
    runpy._run_module_as_main(sys.argv[0], alter_argv=True)


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    module = sys.argv[2] == "-m"
    target = sys.argv[3] if module else sys.argv[2]
    modules = sys.argv[4:] if module else sys.argv[3:]
    # Imported from where the worker's own imports would look first.
    set_path0(target, module)
    for name in modules:
        try:
            __import__(name)
        except BaseException as error:  # SystemExit and KeyboardInterrupt too
            sock.sendall(f"error: import {name} failed: {type(error).__name__}: {error}\n"
                         .encode(errors="replace"))
            os._exit(1)
    why = unusable()
    if why:
        sock.sendall(f"error: {why}\n".encode())
        os._exit(1)
    for sig in STOP_SIGNALS:
        SAVED_HANDLERS[sig] = signal.signal(sig, signal.SIG_IGN)
    sock.sendall(f"ready {os.getpid()}\n".encode())
    fields, out_fd, err_fd, report_fd = serve(sock)
    try:
        argv = become_worker(fields, out_fd, err_fd, report_fd)
    except BaseException as error:
        # The agent takes the fork for failed, and starts this worker cold.
        os.write(report_fd, f"error: the worker could not be set up: {type(error).__name__}: "
                            f"{error}".encode(errors="replace"))
        os._exit(127)
    os.close(report_fd)  # the agent's sign that the worker is set up
    # An uncaught exception (or Ctrl-C) ends the worker as a cold start's
    # would: printed, exit code 1 (or SIGINT), this file's frames left out.
    sys.excepthook = without_our_frames(sys.excepthook)
    if module:
        run_module(argv)
    else:
        run_script(argv)


main()
