"""The console's actions (POST), each behind :func:`require_action`: a session,
write mode, and for a cookie session its CSRF token. Each answers with a
redirect to the page it was done from, which says what was done; an action
the input does not allow answers 400 with that page and the rule broken."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlencode

from aiohttp import web

from fairpost.dispatcher.errors import NotReplayable, UnknownJob
from fairpost.mailer.console.auth import Handler, require_action
from fairpost.mailer.console.context import ACTIONS, AUTH, done, render
from fairpost.mailer.console.pages import MAX_JOB_ID, tenant_from, tenant_page, tenant_path
from fairpost.mailer.errors import ConfirmationStale, InvalidInput

__all__ = ["add_routes"]


def add_routes(post: Callable[[str, Handler], None]) -> None:
    post("/tenants/{tenant}/pause", pause)
    post("/tenants/{tenant}/resume", resume)
    post("/tenants/{tenant}/limits", set_limits)
    post("/tenants/{tenant}/limits/reset", reset_limits)
    post("/tenants/{tenant}/suppressions", suppress)
    post("/tenants/{tenant}/suppressions/remove", unsuppress)
    post("/dead/replay-all", replay_matching)
    post("/dead/purge-all", purge_matching)
    post("/dead/{job_id}/replay", replay)
    post("/dead/{job_id}/purge", purge)


async def _tenant_action(
    request: web.Request, act: Callable[[str, str, dict[str, str]], str]
) -> web.StreamResponse:
    tenant = tenant_from(request)
    session, form = await require_action(request.app[AUTH], request)
    try:
        message = await asyncio.to_thread(act, session.who, tenant, form)
    except InvalidInput as exc:
        return await tenant_page(request, tenant, status=400, error=str(exc), limits=form.get("limits"))
    raise done(request, tenant_path(tenant), message)


async def pause(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(request, lambda who, t, form: request.app[ACTIONS].pause(who, t))


async def resume(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(request, lambda who, t, form: request.app[ACTIONS].resume(who, t))


async def set_limits(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(
        request, lambda who, t, form: request.app[ACTIONS].set_limits(who, t, form.get("limits", ""))
    )


async def reset_limits(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(request, lambda who, t, form: request.app[ACTIONS].reset_limits(who, t))


async def suppress(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(
        request, lambda who, t, form: request.app[ACTIONS].suppress(who, t, form.get("address", ""))
    )


async def unsuppress(request: web.Request) -> web.StreamResponse:
    return await _tenant_action(
        request, lambda who, t, form: request.app[ACTIONS].unsuppress(who, t, form.get("ref", ""))
    )


def _job_id(request: web.Request) -> str:
    job_id = request.match_info["job_id"]
    if len(job_id) > MAX_JOB_ID:
        raise web.HTTPNotFound(text="no job has this id\n")
    return job_id


async def _job_action(request: web.Request, act: Callable[[str, str], str], back: str) -> web.StreamResponse:
    job_id = _job_id(request)
    session, form = await require_action(request.app[AUTH], request)
    try:
        message = await asyncio.to_thread(act, session.who, job_id)
    except UnknownJob:
        raise web.HTTPNotFound(text=f"no dead letter has the id {job_id}\n") from None
    except NotReplayable as exc:
        raise web.HTTPConflict(text=f"{exc}\n") from None
    target = f"/jobs/{job_id}" if form.get("back") == "job" else back
    raise done(request, target, f"job {job_id}: {message}")


async def replay(request: web.Request) -> web.StreamResponse:
    return await _job_action(request, request.app[ACTIONS].replay, "/dead")


async def purge(request: web.Request) -> web.StreamResponse:
    return await _job_action(request, request.app[ACTIONS].purge, "/dead")


async def _matching(request: web.Request, action: str) -> web.StreamResponse:
    session, form = await require_action(request.app[AUTH], request)
    tenant = form.get("tenant", "").strip()
    reason = form.get("reason", "").strip()
    count = form.get("count", "")
    if not count.isdigit():
        raise web.HTTPBadRequest(text="count: the number of dead letters confirmed is required\n")
    act = request.app[ACTIONS].replay_matching if action == "replay" else request.app[ACTIONS].purge_matching
    query = urlencode({k: v for k, v in (("tenant", tenant), ("reason", reason)) if v})
    try:
        message = await asyncio.to_thread(act, session.who, tenant, reason, int(count))
    except ConfirmationStale as exc:
        # Someone changed the dead letters since the count was shown: show the new count.
        return render(
            request, "confirm.html", status=409, title="Look again", action=action,
            tenant=tenant, reason=reason, count=exc.now, error=str(exc),
        )  # fmt: skip
    except InvalidInput as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None
    raise done(request, "/dead" + (f"?{query}" if query else ""), message)


async def replay_matching(request: web.Request) -> web.StreamResponse:
    return await _matching(request, "replay")


async def purge_matching(request: web.Request) -> web.StreamResponse:
    return await _matching(request, "purge")
