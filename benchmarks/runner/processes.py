"""Process supervision: every child the run starts, ended by id; commands run at once, waited for, their logs read."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# Variables the harness sets per rank; anything else HOROVOD_* (fusion, cycle time) passes through.
RANK_VARIABLES = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_CONTROLLER",
                   "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "HOROVOD_HOSTNAME",
                   "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                   "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclass
class Processes:
    """Every child the harness started and has not reaped: ended by id on the way out."""

    running: list[subprocess.Popen] = field(default_factory=list)

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self.running.append(process)
        return process

    def stop(self, process: subprocess.Popen, grace_s: float = 5.0) -> None:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        if process in self.running:
            self.running.remove(process)

    def stop_all(self) -> None:
        for process in list(self.running):
            self.stop(process, grace_s=2.0)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def read_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The child's next stdout line, or ``TimeoutError`` naming the command."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no output from `{' '.join(map(str, process.args))}` within {timeout_s:.0f} s")
    return process.stdout.readline().strip()


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return env


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_all(workers: list[subprocess.Popen], processes: Processes, timeout_s: float) -> str | None:
    """Wait for every worker; on the first failure or the timeout, stop the rest. Returns why, or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [w.poll() for w in workers]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed or time.monotonic() > deadline:
            for worker in workers:
                processes.stop(worker)
            return (f"rank {failed[0]} exited with {codes[failed[0]]}" if failed
                    else f"timed out after {timeout_s:.0f} s")
        if all(code == 0 for code in codes):
            for worker in workers:
                processes.running.remove(worker)
            return None
        time.sleep(0.2)


def run_concurrently(processes: Processes, commands: list[list[str]], logs: list[Path], timeout_s: float,
                     what: str) -> None:
    """Every command at once on this machine (no namespace, no Horovod), each writing its own log; a
    failure raises ``RuntimeError`` naming ``what``, with the first log's tail."""
    files = [open(log, "w") for log in logs]
    try:
        started = [processes.start(command, stdout=file, stderr=subprocess.STDOUT, env=child_env())
                   for command, file in zip(commands, files)]
        failure = wait_all(started, processes, timeout_s)
    finally:
        for file in files:
            file.close()
    if failure:
        raise RuntimeError(f"{what} failed: {failure}\n{tail(logs[0])}")
