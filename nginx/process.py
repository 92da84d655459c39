"""One nginx process the renderer runs: its prefix folder (``nginx.conf``, ``upstreams.conf``,
the pid file, logs), checked with ``nginx -t`` before it starts or reloads, started with an
environment of its own, reloaded and stopped; and the folders its workers may write in."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import signal
import subprocess
import tempfile
from pathlib import Path

from .metrics import RELOADS

log = logging.getLogger("nginx.render")
# nginx and `nginx -t` get this environment and nothing else: its workers (``nobody`` under
# root) must not hold the renderer's Consul token in /proc/<pid>/environ or their memory
NGINX_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


class NginxExited(RuntimeError):
    """An nginx the renderer runs has exited (the renderer stops, and exits non-zero)."""


class Nginx:
    """One nginx: ``name`` (``entry`` or ``side``: the label of its reloads), its prefix and
    binary, and its process once started (``daemon off``: a child of the renderer)."""

    def __init__(self, name: str, prefix: Path, binary: str) -> None:
        self.name, self.prefix, self.binary = name, prefix, binary
        self.child: subprocess.Popen[bytes] | None = None
        self.reloads = 0

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def upstreams_conf(self) -> Path:
        return self.prefix / "upstreams.conf"

    def nginx_check(self, upstreams_text: str) -> str | None:
        """``nginx -t`` of nginx.conf with ``upstreams_text`` in place of upstreams.conf
        (copies in a temporary folder under the prefix; nothing nginx runs with is touched):
        None if it passes, else nginx's complaint."""
        conf = self.conf.read_text()
        include = f"include {self.upstreams_conf.resolve()};"
        with tempfile.TemporaryDirectory(dir=self.prefix, prefix=".check-") as folder:
            candidate = Path(folder) / "upstreams.conf"
            candidate.write_text(upstreams_text)
            checked = Path(folder) / "nginx.conf"
            checked.write_text(conf.replace(include, f"include {candidate.resolve()};"))
            return self.test_config(checked)

    def test_config(self, conf: Path | None = None) -> str | None:
        run = subprocess.run([self.binary, "-t", "-q", "-p", str(self.prefix), "-c",
                              str(conf or self.conf)], capture_output=True, text=True,
                             env=NGINX_ENV, timeout=30)
        return None if run.returncode == 0 else (run.stderr.strip() or f"exit {run.returncode}")

    def reload(self) -> bool:
        """SIGHUP to the nginx master: new workers take the new upstreams, old ones finish.
        True if it was sent (nginx runs and its config passes nginx -t)."""
        pid = self.child.pid if self.child else _pid(self.prefix / "nginx.pid")
        if pid is None:
            return False
        problem = self.test_config()
        if problem is not None:
            log.error("not reloading the %s nginx, its config does not pass nginx -t: %s",
                      self.name, problem)
            return False
        os.kill(pid, signal.SIGHUP)
        self.reloads += 1
        RELOADS.labels(self.name).inc()
        return True

    def start(self) -> None:
        """Run nginx, with ``NGINX_ENV`` as its whole environment, once its config passes
        ``nginx -t`` (RuntimeError otherwise: it would not serve)."""
        problem = self.test_config()
        if problem is not None:
            raise RuntimeError(f"not starting the {self.name} nginx, its config fails "
                               f"nginx -t: {problem}")
        self.child = subprocess.Popen([self.binary, "-p", str(self.prefix), "-c",
                                       str(self.conf)], env=NGINX_ENV)
        log.info("%s nginx running (pid %s)", self.name, self.child.pid)

    def stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGQUIT)  # graceful: finish requests in flight
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_atomically(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` unless it already says that; True if it changed."""
    if path.is_file() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def worker_user() -> str:
    """nginx.conf's ``user`` line: under root, workers drop to ``nobody`` (said explicitly;
    ``workers_folder`` gives them folders they can reach); otherwise none."""
    if os.geteuid() != 0:
        return ""
    nobody = pwd.getpwnam("nobody")
    return f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"


def workers_folder(label: str) -> Path:
    """A new folder in the system's temp dir, 0700 and owned by the user nginx's workers run
    as (``nobody`` under root, else this user): only they and root reach what is in it."""
    folder = Path(tempfile.mkdtemp(prefix=f"tiered-nginx-{label}-"))
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    return folder


def temp_dir(prefix: Path) -> Path:
    """Where nginx buffers request bodies (and responses) too big for memory: under the prefix,
    unless nginx runs as root. Its workers then run as ``nobody``, who may not reach the prefix
    (a 0700 parent folder): a body over 16 KiB would get a 500. They get a folder of their own
    in the system's temp dir instead."""
    if os.geteuid() != 0:
        return prefix / "tmp"
    return workers_folder("temp")
