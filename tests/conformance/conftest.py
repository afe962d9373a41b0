"""The conformance suite runs every test against every backend listed here.

A backend adds itself by naming the fixture (defined in ``tests/backends/``) that
yields a ready client. Backends with an expensive start (Ray, the Fray cluster)
share one session-scoped cluster; tests use unique names so they never collide.
"""

import uuid

import pytest

from backends.iris import iris_installed

BACKEND_FIXTURES = {
    "local": "local_client",
    "ray": "ray_client",
    "fray": "cluster_client",
    "monarch": "monarch_client",
}

# Iris needs Python >= 3.12: on older Pythons tests/iris/test_iris_suite.py runs these tests in a 3.12 venv.
if iris_installed():
    BACKEND_FIXTURES["iris"] = "iris_client"

# The only conformance tests a backend does not run, each with the reason it cannot apply there: they are
# skipped for that backend only, with the reason shown. Each entry is a documented limit of the backend.
_MONARCH_NO_RESTARTS = (
    "the Monarch backend restarts no actor and kills no actor process on purpose (Monarch 0.7.0 exits the "
    "creating process after a crashed actor is called): ActorConfig(max_restarts, max_task_retries) and "
    "kill_actor are refused by name (tests/monarch/test_monarch_actor_config.py)"
)
_IRIS_NO_ALTERNATIVES = (
    "Iris places a job on one kind of device: a choice among variants of one kind becomes Iris's device-variant "
    "constraint (tests/iris_backend/test_mapping.py), but a choice between a GPU and the CPU cannot be placed by "
    "one Iris job and is refused by name"
)
_MONARCH_NO_PREEMPT = (
    "fray.testing.preempt is refused by name on Monarch: Monarch 0.7.0 exits the client's process about 30 s "
    "after a process that had called an actor dies abruptly (tests/conformance/test_fault_injection.py)"
)
_IRIS_KILL_LAGS = (
    "Iris reports a cancelled job KILLED when its controller records the cancel; the worker kills "
    "the process on its next reconcile tick (about 1 s later) and Iris exposes no signal of the exit"
)
_IRIS_NO_PREEMPT = "Fray does not preempt Iris tasks: fray.testing.preempt is refused by name there"
_MONARCH_NEVER_WAITS = (
    "the Monarch backend starts every job at once on this host (cpu, ram and disk are not reserved there), "
    "so no job waits for a place"
)
_IRIS_NEVER_WAITS = (
    "Iris refuses at submit a job that no scaling group can hold (ConfigError naming what it needs and what a VM "
    "has), and its local cluster starts more workers for one that fits, so no job of the test cluster waits for a "
    "place; IrisJobHandle.info() passes on Iris's own pending reason"
)
_WAITING_TESTS = (
    "test_a_job_nothing_can_place_says_why_once_on_stderr",
    "test_info_carries_the_pending_reason",
    "test_timeouts_name_the_pending_job_and_why",
    "test_a_burst_nothing_can_place_says_why_in_one_line",
)
_PREEMPT_TESTS = (
    "test_preempted_job_is_retried_within_its_preemption_budget",
    "test_preemption_past_the_budget_fails_with_the_lifecycle_wording",
    "test_preempting_one_replica_retries_the_whole_gang",
    "test_a_preempted_replica_without_budget_fails_the_job_naming_it",
    "test_preempt_refuses_what_it_cannot_preempt",
    "test_preempt_names_a_replica_the_job_lacks",
)
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "ray": {
        "test_a_callable_job_that_sigkills_its_process_fails_naming_sigkill": (
            "Ray reports a worker process that died while running a task as WorkerCrashedError, without its signal, "
            "exit status or output, as it reports a preempted node; Fray counts it as a preemption "
            "(fray.testing.preempt relies on it) and says 'lost its worker or node (WorkerCrashedError)' "
            "(docs/debugging.md, 'Why did it die?')"
        ),
    },
    "local": {
        "test_a_callable_job_that_sigkills_its_process_fails_naming_sigkill": (
            "the local backend runs callable jobs as threads of the calling process (README, 'The local backend in "
            "one paragraph'): a job that SIGKILLs its process kills the caller; its binary jobs are processes and "
            "say which signal ended them (test_a_program_that_sigkills_itself_fails_naming_sigkill_with_its_last_output)"
        ),
    },
    "monarch": {
        **dict.fromkeys(_PREEMPT_TESTS, _MONARCH_NO_PREEMPT),
        **dict.fromkeys(_WAITING_TESTS, _MONARCH_NEVER_WAITS),
        "test_killed_actor_restarts_and_in_flight_calls_fail": _MONARCH_NO_RESTARTS,
        "test_killed_actor_without_restarts_stays_dead": _MONARCH_NO_RESTARTS,
        "test_call_in_flight_is_retried_on_the_restarted_actor": _MONARCH_NO_RESTARTS,
        "test_detached_actor_outlives_its_client": (
            "Monarch's processes are children of the client's process and end with it: "
            "ActorConfig(lifetime='detached') is refused by name (tests/monarch/test_monarch_actor_config.py)"
        ),
    },
    "iris": {
        **dict.fromkeys(_PREEMPT_TESTS, _IRIS_NO_PREEMPT),
        **dict.fromkeys(_WAITING_TESTS, _IRIS_NEVER_WAITS),
        "test_work_goes_to_an_alternative_the_backend_has": _IRIS_NO_ALTERNATIVES,
        "test_an_actor_reports_the_device_it_got": _IRIS_NO_ALTERNATIVES,
        "test_shutdown_is_announced_to_a_running_method": (
            "Iris's process runtime stops a task with SIGKILL at once, so nothing reaches the actor first: "
            "current_actor().shutdown_requested is never set on Iris"
        ),
        "test_terminated_callable_job_stops_running": _IRIS_KILL_LAGS,
        "test_terminate_stops_every_process_of_a_replica": _IRIS_KILL_LAGS,
    },
}


@pytest.fixture(params=sorted(BACKEND_FIXTURES))
def client(request: pytest.FixtureRequest):
    """A client of each backend in turn."""
    reason = NOT_APPLICABLE.get(request.param, {}).get(request.node.originalname)
    if reason:
        pytest.skip(f"not applicable on {request.param}: {reason}")
    return request.getfixturevalue(BACKEND_FIXTURES[request.param])


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job and actor names."""
    return uuid.uuid4().hex[:6]
