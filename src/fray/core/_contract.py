"""The backend contract in one place: the roles a backend fills, their declared bases, and who fills them.

A backend is a thin adapter: it subclasses one declared base per role and implements
that base's abstract methods (the hooks); everything the roles have in common (argument
checks, waiting, errors, the driver-exit rule) is written once in the base.

=====================  ============================================  =====================================
role                   declared base (hooks)                         what it writes once
=====================  ============================================  =====================================
client                 :class:`fray.core._client_core.ClientCore`    refusals after shutdown, request
                       (``_start_job``, ``_create_actor``,           checks, ``adopt_existing``, groups,
                       ``_create_actors``, ``_create_group``,        ``submit_many``'s guards, the job
                       ``_live_job``, ``_known_finished``,           context made once, owned work,
                       ``_open_queue``, ``_make_job_context``,       shutdown, the driver-exit rule
                       ``_owned_work``, ``_end``, ``_release``,
                       ``_exit_notice``, ``_outlives_script``,
                       ``_leftovers_at_exit``, ``from_spec``)
job handle             :class:`fray.job.JobHandleBase`               ``wait_all``'s batching, the
                       (``job_id``, ``wait``, ``status``, ``info``,  default polling wait, refusing
                       ``terminate``, ``logs``, ``_fray_wait_some``, ``preempt`` by name, refusing
                       ``_fray_preempt``, ``stacks``)                ``stacks`` by name
actor handle           :class:`fray.actor.ActorHandleBase`           ``handle.method(...)`` and
                       (``_fray_call``, ``_fray_call_sync``,         ``.remote(...)`` (RemoteMethod),
                       ``_fray_ready``, ``_fray_kill``, ``stacks``)  refusing ``kill_actor`` and
                                                                     ``stacks`` by name; an actor
                                                                     group's ``stacks``
queue client           :class:`fray.queue.QueueClient`               the ten queue methods: argument and
                       (``_push``, ``_peek``, ``_take``, ``_done``,  lease checks, blocking ``pop``,
                       ``_counts``)                                  lease errors, ``done_many``'s error
job context            :class:`fray.context.JobContextBase`          argument and ref checks, refs among
                       (``_REF``, ``_submit``, ``_put``,             a task's arguments, ``get``'s one-or-
                       ``_values``, ``_first_ready``, ``_owns``)     list form, ``create_actor``
actor host             :class:`fray.actor_context.ActorCalls`        counting calls in and out, refusing
                       (``on_end``: what the backend does when       them once the actor ended (a copy of
                       the actor ends itself)                        its death each), ``wait_idle``
=====================  ============================================  =====================================

Who fills each role (``tests/conformance/test_contract.py`` checks the first four on every backend):

=========  ===================  ====================  =================  ===========================  ======================
backend    job handle           actor handle          queue client       job context                  actor host
=========  ===================  ====================  =================  ===========================  ======================
local      LocalJobHandle       LocalActorHandle      LocalQueue         LocalJobContext,             (threads of the
                                                                         ProcessJobContext            caller's process)
fray://    ClusterJobHandle     ClusterActorHandle    ClusterQueue       ClusterJobContext            taskproc._actor_host
Ray        RayJobHandle (3)     RayActorHandle        RayQueue           RayJobContext                inside._actor_host
Monarch    MonarchJobHandle     MonarchActorHandle    ActorQueue         MonarchJobContext            host.FrayHost
Iris       IrisJobHandle,       IrisActorHandle       (refused: use      LocalJobContext (threads     _actor_host._Dispatch
           IrisMemberJob                              ``actor_queue``)   of the job)
=========  ===================  ====================  =================  ===========================  ======================

Who answers ``stacks()`` (live stacks, :mod:`fray.stacks`): every process Fray runs user code in
serves its own stacks on a private Unix socket (:func:`fray.core.inside._stacks.serve`), and a relay
on the same host asks it (:func:`fray.core.inside._stacks.ask`):

=========  =====================================================================================
backend    relay
=========  =====================================================================================
local      the handle itself: threads of this process are captured by ident (replicas, actor
           threads, ``LocalJobContext`` tasks); replicas run as processes and
           ``ProcessJobContext`` workers are asked (``fray.local._local_stacks``)
fray://    client -> controller (``job_stacks``, ``actor_stacks``; no lock held while waiting)
           -> each worker holding a task -> the worker asks its task processes' pids
Ray        see ``fray.ray`` (the other backends relay through their own host processes)
Monarch    see ``fray.monarch``
Iris       see ``fray.iris``
=========  =====================================================================================

Backends are loaded by scheme through ``importlib`` (:func:`fray.client.client_from_spec`),
so nothing in the program hands mypy a backend where a ``Client`` is expected; the
functions below do. Each would fail ``mypy`` the day a backend's public method stops
matching the protocol. Nothing imports this module at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fray.client import Client
    from fray.cluster.client import ClusterClient
    from fray.iris.client import IrisClient
    from fray.local import LocalClient
    from fray.monarch.client import MonarchClient
    from fray.ray.client import RayClient

__all__: list[str] = []


def _local(client: LocalClient) -> Client:
    return client


def _cluster(client: ClusterClient) -> Client:
    return client


def _ray(client: RayClient) -> Client:
    return client


def _monarch(client: MonarchClient) -> Client:
    return client


def _iris(client: IrisClient) -> Client:
    return client
