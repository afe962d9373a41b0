"""Binary jobs on Ray: one Ray job (``JobSubmissionClient``) per replica.

A Ray job runs once; Fray resubmits it within the job's budgets, which it keeps,
like every job kind's state, in a :class:`~fray.core._lifecycle.JobLifecycle`. A job whose
driver exited with a code failed (``max_retries_failure``); a job without one (its
supervisor died with the node) was preempted (``max_retries_preemption``). Ray's job
API has no push notifications, so one thread per job watches it.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from typing import Any

from fray.core._lifecycle import Failure
from fray.job import BinaryEntrypoint, JobInfo, JobRequest, JobStatus
from fray.job_info import replica_env
from fray.ray._launch import Launcher, runtime_env, user_env
from fray.ray.jobs import RayJobHandle
from fray.ray.resources import bundle, ray_options
from fray.resources import device_name

__all__ = ["BinaryJob"]

# Lines Ray's job manager writes to the top of every job log.
# What Ray's job manager and supervisor write into a job's log besides the program's output.
_RAY_SETUP_LINE = " -- Runtime env is setting up."
_RAY_ENTRYPOINT_LINE = "Running entrypoint for job "
_TAIL = 5  # lines of output quoted in a failure


def _submit_with_retry(jobs: Any, **kwargs: Any) -> None:
    """``jobs.submit_job(**kwargs)``, retried while Ray's job agent is still starting.

    Right after a cluster starts, the dashboard answers before the job agent on the head
    node does, and Ray refuses submissions with a server error for a few seconds.
    """
    deadline = time.monotonic() + 45
    delay = 0.1
    while True:
        try:
            jobs.submit_job(**kwargs)
            return
        except RuntimeError as exc:
            text = str(exc)
            transient = "already exists" not in text and any(
                marker in text for marker in ("503", "500", "502", "504", "agent", "not ready", "Timeout")
            )
            if not transient or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)  # backing off from a server that is still starting, not synchronisation
            delay = min(delay * 2, 2.0)


class BinaryJob(RayJobHandle):
    """A binary job: one Ray job per replica and attempt, watched by one thread."""

    _POLL = 0.2  # seconds between two looks at Ray's job API

    def __init__(self, launcher: Launcher, job_id: str, request: JobRequest) -> None:
        super().__init__(
            job_id, request.name, request.max_retries_failure, request.max_retries_preemption, request.timeout_seconds
        )
        assert isinstance(request.entrypoint, BinaryEntrypoint)
        self._launcher = launcher
        self._request = request
        self._entry: BinaryEntrypoint = request.entrypoint
        self._submissions: list[str] = []
        self._old_submissions: list[str] = []

    def start(self) -> None:
        """Submit the first attempt (raises if Ray's job API refuses it), then watch it."""
        self._launch()
        threading.Thread(target=self._watch, name=f"fray-ray-job-{self._job_id}", daemon=True).start()

    def _launch(self) -> None:
        request, launcher = self._request, self._launcher
        jobs = launcher.job_submission()
        options = ray_options(request.resources, pin_resource=launcher.pin_resource())
        attempt = self._lifecycle.attempt
        submissions = []
        for index in range(request.replicas):
            if self._stopping:
                break
            device = device_name(request.resources.device)
            info = JobInfo(
                self._job_id,
                request.name,
                index,
                request.replicas,
                launcher.namespace,
                attempt,
                device,
                priority_band=request.priority,
            )
            env = replica_env(info, launcher.spec, user_env(request))
            submission_id = f"fray-{self._job_id.replace('/', '.')}-a{attempt}-r{index}"
            _submit_with_retry(
                jobs,
                entrypoint=shlex.join(self._entry.argv),
                submission_id=submission_id,
                runtime_env=runtime_env(request, env),
                metadata={"fray_job_id": self._job_id, "fray_namespace": launcher.namespace},
                entrypoint_num_cpus=options.get("num_cpus"),
                entrypoint_num_gpus=options.get("num_gpus"),
                entrypoint_memory=options.get("memory"),
                entrypoint_resources=options.get("resources"),
                entrypoint_label_selector=options.get("label_selector"),
            )
            submissions.append(submission_id)
        with self._lock:
            self._submissions = submissions
        if self._stopping:  # terminate() came while this attempt was being submitted
            self._stop_submissions()

    def _ray_statuses(self) -> list[Any]:
        jobs = self._launcher.job_submission()
        with self._lock:
            submissions = list(self._submissions)
        return [jobs.get_job_info(s) for s in submissions]

    def _watch(self) -> None:
        while not self._lifecycle.finished:
            try:
                infos = self._ray_statuses()
            except Exception:  # the API briefly unreachable: look again
                self._lifecycle.wait_done(self._POLL)
                continue
            if self._stopping:
                return
            statuses = [str(i.status) for i in infos]
            failed = [n for n, status in enumerate(statuses) if status in ("FAILED", "STOPPED")]
            if failed:
                if not self._attempt_failed(failed[0], infos):
                    return
                continue
            if statuses and all(s == "SUCCEEDED" for s in statuses):
                self._lifecycle.start()
                self._lifecycle.succeed()
                return
            if "RUNNING" in statuses:
                self._lifecycle.start()
            self._lifecycle.wait_done(self._POLL)

    def _attempt_failed(self, index: int, infos: list[Any]) -> bool:
        """Stop the attempt's other replicas, then retry within the budget; True if a new attempt runs."""
        self._stop_submissions()
        with self._lock:
            submission = self._submissions[index]
        failure = self._failure_of(submission, infos[index]).in_replica(index, len(infos))
        self._lifecycle.start()  # the attempt ran, whether or not the watcher saw it running
        with self._lock:
            if self._stopping or not self._lifecycle.attempt_failed(failure):
                return False
            self._old_submissions += self._submissions
            self._submissions = []
        try:
            self._launch()
        except Exception as exc:
            self._lifecycle.fail(Failure(f"Ray's job API refused the retry: {type(exc).__name__}: {exc}"))
            return False
        return True

    def _failure_of(self, submission: str, info: Any) -> Failure:
        code = info.driver_exit_code
        tail = self._submission_logs(submission)[-_TAIL:]
        if code is None or "SUPERVISOR" in str(info.error_type or "").upper():
            message = f"{self._entry.command!r} lost its Ray job: {info.message}"
            return Failure.lost(message + ("; last output:\n" + "\n".join(tail) if tail else ""))
        return Failure.from_exit(self._entry.command, int(code), tail)

    def _needs(self) -> tuple[dict[str, float], int] | None:
        options = ray_options(self._request.resources, pin_resource=self._launcher.pin_resource())
        return bundle(options), self._request.replicas

    def status(self) -> JobStatus:
        """Asks Ray's job API while the job is live (so RUNNING shows as soon as Ray says so)."""
        if not self._lifecycle.finished:
            with contextlib.suppress(Exception):
                if any(str(i.status) == "RUNNING" for i in self._ray_statuses()):
                    self._lifecycle.start()
        return self._lifecycle.status

    def _stop_submissions(self) -> None:
        jobs = self._launcher.job_submission()
        with self._lock:
            submissions = list(self._submissions)
        for submission in submissions:
            with contextlib.suppress(Exception):
                jobs.stop_job(submission)

    def terminate(self) -> None:
        """Ask Ray to stop every replica (SIGTERM, then SIGKILL) and wait until it has."""
        if not self._begin_stop():
            return
        self._stop_submissions()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if all(i.status.is_terminal() for i in self._ray_statuses()):
                    break
            time.sleep(0.05)  # Ray's job API has no way to wait for a stop
        self._lifecycle.stop()

    def _submission_logs(self, submission: str) -> list[str]:
        with contextlib.suppress(Exception):
            text = self._launcher.job_submission().get_job_logs(submission)
            # Ray's supervisor writes its "Running entrypoint" line through a buffered file that may
            # reach the log after a fast program's output, glued to a last line without a newline:
            # remove exactly that text, never the line it landed on.
            text = text.replace(f"{_RAY_ENTRYPOINT_LINE}{submission}: {shlex.join(self._entry.argv)}\n", "", 1)
            return [line for line in text.splitlines() if not line.endswith(_RAY_SETUP_LINE)]
        return []

    def _live_logs(self) -> list[str]:
        """Every attempt's output, as Ray's job API returns it (without Ray's own preamble)."""
        with self._lock:
            submissions = self._old_submissions + self._submissions
        return [line for submission in submissions for line in self._submission_logs(submission)]
