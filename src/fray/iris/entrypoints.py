"""What an Iris task runs for a Fray job: its entrypoint, and the wrappers Iris leaves to the submitter.

Iris runs a task's command verbatim. A callable entrypoint runs through
:func:`fray.iris._task.run_callable` (which reports an exception on the task's failure line), a
binary one through :data:`fray.iris._task.BINARY_WRAPPER`. Two wrappers are composed into the
command here, at submit, because they must be the task's outermost processes:
``processes_per_task`` (Iris's multi-GPU supervisor, :func:`wrap_multiprocess`) and Nsight
Systems profiling when ``IRIS_NSYS_TASKS`` is set (:func:`wrap_nsys`).
"""

from __future__ import annotations

import os
from typing import Any

from iris.cluster.types import Entrypoint as IrisEntrypoint
from iris.cluster.types import ResourceSpec
from iris.jax.multigpu import build_multigpu_hook

from fray.core._codepickle import dumps
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError, SerializationError
from fray.iris import _task
from fray.job import CallableEntrypoint, EntrypointType

__all__ = [
    "NSYS_TASKS_ENV",
    "check_processes_per_task",
    "convert_entrypoint",
    "iris_entrypoint",
    "pickled",
    "wrap_multiprocess",
    "wrap_nsys",
]

#: The variable that turns on Nsight Systems profiling of the submitted jobs' tasks: ``first``,
#: ``all`` or a comma-separated list of task indices (``iris.hooks.nsys_main --tasks``).
NSYS_TASKS_ENV = "IRIS_NSYS_TASKS"

_NSYS_MODULE = "iris.hooks.nsys_main"
#: How Iris's callable entrypoint starts its runner: ``bash -c "exec $IRIS_PYTHON ..."``.
_SHELL_EXEC = "exec "


def pickled(what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str = "the callable") -> bytes:
    """``(fn, args, kwargs)`` cloudpickled; a piece that cannot be is named in a SerializationError."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as exc:
        check_picklable(what, call_parts(fn, args, kwargs, label))
        raise SerializationError(f"{what}: cannot be pickled ({type(exc).__name__}: {exc})") from exc


def iris_entrypoint(entrypoint: EntrypointType, what: str) -> IrisEntrypoint:
    """The Iris entrypoint of a Fray one; ``what`` names it in a SerializationError (``"job 'x'"``)."""
    if isinstance(entrypoint, CallableEntrypoint):
        payload = pickled(what, entrypoint.callable, entrypoint.args, dict(entrypoint.kwargs))
        return IrisEntrypoint.from_callable(_task.run_callable, payload)
    return IrisEntrypoint.from_command(*_task.binary_command(entrypoint.argv))


def convert_entrypoint(entrypoint: EntrypointType) -> IrisEntrypoint:
    """Convert a Fray entrypoint to the Iris entrypoint Fray's backend submits for it."""
    return iris_entrypoint(entrypoint, "the entrypoint")


def wrap_multiprocess(entrypoint: IrisEntrypoint, resources: ResourceSpec, processes_per_task: int) -> IrisEntrypoint:
    """Prepend Iris's multi-GPU supervisor so each task runs ``processes_per_task`` GPU processes.

    Iris runs the entrypoint verbatim, so the supervisor is composed here. It needs a GPU device
    whose count ``processes_per_task`` divides (each process gets an equal share); Iris's
    ``ValueError`` says which is wrong. The processes learn their rank from the
    ``IRIS_MULTIGPU_PROCESS_*`` variables the supervisor sets.
    """
    hook = build_multigpu_hook(resources, processes_per_task)
    return _with_command(entrypoint, hook.wrap(entrypoint.command))


def check_processes_per_task(processes_per_task: int, resources: ResourceSpec, job: str) -> None:
    """Refuse at submit, as a ConfigError naming the field, what :func:`wrap_multiprocess` cannot run."""
    try:
        build_multigpu_hook(resources, processes_per_task)
    except ValueError as exc:
        raise ConfigError(
            f"job {job!r}: JobRequest(processes_per_task={processes_per_task}) runs that many GPU processes per "
            f"task on Iris: {exc}"
        ) from exc


def wrap_nsys(entrypoint: IrisEntrypoint) -> IrisEntrypoint:
    """Run the entrypoint under ``nsys profile`` when ``IRIS_NSYS_TASKS`` is set (else unchanged).

    Nsight injects its CUDA tracing when the driver starts, so it must be the task's parent
    process from the start; Iris does not add it. The variable holds the ``--tasks`` spec
    (``first``, ``all``, or task indices); an unselected task execs its command unchanged. A
    shell entrypoint (``bash -c "exec ..."``, Iris's callable form) gets the wrapper inside its
    ``exec``, where ``$IRIS_PYTHON`` is expanded; any other command is prefixed.
    """
    tasks = os.environ.get(NSYS_TASKS_ENV, "").strip()
    if not tasks:
        return entrypoint
    hook = ["$IRIS_PYTHON", "-m", _NSYS_MODULE, "--tasks", tasks, "--"]
    command = list(entrypoint.command)
    if len(command) == 3 and command[:2] == ["bash", "-c"] and command[2].startswith(_SHELL_EXEC):
        script = command[2][len(_SHELL_EXEC) :]
        wrapped = ["bash", "-c", _SHELL_EXEC + " ".join(hook) + " " + script]
    else:
        wrapped = [*hook, *command]
    return _with_command(entrypoint, wrapped)


def _with_command(entrypoint: IrisEntrypoint, command: list[str]) -> IrisEntrypoint:
    """``entrypoint`` running ``command``, with the same files in its work directory."""
    return IrisEntrypoint(
        command=command, workdir_files=entrypoint.workdir_files, workdir_file_refs=entrypoint.workdir_file_refs
    )
